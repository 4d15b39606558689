"""Which system libraries Qt's xcb plugin (the X11 window) lacks, and the packages that provide them.

Qt's own error names `libxcb-cursor0` whichever library is missing (measured on Debian 12 with
libxcb-cursor0 installed: the plugin lacked libxcb-icccm.so.4 and libxcb-keysyms.so.1), so the
Studio asks the dynamic linker instead: `ldd` on the plugin lists every library it cannot find,
its dependencies' included. Where `ldd` is missing, the `QT_DEBUG_PLUGINS=1` output of a failed
start names the first one. Each library is mapped to its package on Debian/Ubuntu, Fedora and
Arch (a table, as data), with the command that installs them.

Nothing here imports PySide6: the plugin is found from the package's location on disk.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LDD_TIMEOUT_S = 30
_LDD_MISSING = re.compile(r"^\s*(\S+\.so[.\d]*)\s*=>\s*not found", re.MULTILINE)
_OS_RELEASE_FIELD = re.compile(r'^(\w+)=(["\']?)(.*?)\2\s*$', re.MULTILINE)
_DLOPEN_MISSING = re.compile(r"(lib[\w.+-]+\.so[.\d]*): cannot open shared object file")


@dataclass(frozen=True)
class Family:
    key: str  # "debian" | "fedora" | "arch"
    title: str
    install: str  # the command, packages appended


FAMILIES = (
    Family("debian", "Debian/Ubuntu", "sudo apt-get install"),
    Family("fedora", "Fedora", "sudo dnf install"),
    Family("arch", "Arch", "sudo pacman -S --needed"),
)
FAMILY_BY_KEY = {family.key: family for family in FAMILIES}
# os-release IDs (ID and ID_LIKE) that use each family's packages
_FAMILY_IDS = {"debian": {"debian", "ubuntu", "linuxmint", "pop", "raspbian"},
               "fedora": {"fedora", "rhel", "centos", "rocky", "almalinux"},
               "arch": {"arch", "manjaro", "endeavouros"}}

# shared library -> (Debian/Ubuntu, Fedora, Arch) package: what Qt 6's xcb plugin and its libraries load
PACKAGES: dict[str, tuple[str, str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libSM.so.6": ("libsm6", "libSM", "libsm"),
    "libICE.so.6": ("libice6", "libICE", "libice"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
}


def missing_from_ldd(output: str) -> list[str]:
    """The libraries `ldd` reports as "not found", each once, in its order."""
    return list(dict.fromkeys(_LDD_MISSING.findall(output)))


def missing_from_qt_debug(output: str) -> list[str]:
    """The libraries a `QT_DEBUG_PLUGINS=1` start could not open ("libX.so.N: cannot open shared object file")."""
    return list(dict.fromkeys(_DLOPEN_MISSING.findall(output)))


def family_from_os_release(text: str) -> Family | None:
    """The package family of the distribution /etc/os-release describes (by ID, then ID_LIKE), or None."""
    fields = {key: value for key, _quote, value in _OS_RELEASE_FIELD.findall(text)}
    ids = [fields.get("ID", ""), *fields.get("ID_LIKE", "").split()]
    for distro in ids:
        for key, members in _FAMILY_IDS.items():
            if distro.lower() in members:
                return FAMILY_BY_KEY[key]
    return None


def packages_for(missing: list[str], family: Family) -> tuple[list[str], list[str]]:
    """(packages to install, libraries no package is known for) on `family`."""
    column = [f.key for f in FAMILIES].index(family.key)
    packages = [PACKAGES[lib][column] for lib in missing if lib in PACKAGES]
    return list(dict.fromkeys(packages)), [lib for lib in missing if lib not in PACKAGES]


def install_advice(missing: list[str], os_release: str = "") -> str:
    """What to tell the user: the missing libraries, then the install command for their distribution
    (every family's when it is not known)."""
    family = family_from_os_release(os_release)
    lines = [f"Qt's X11 window plugin cannot load: {', '.join(missing)} "
             f"{'is' if len(missing) == 1 else 'are'} missing."]
    for each in [family] if family is not None else list(FAMILIES):
        packages, _ = packages_for(missing, each)
        if packages:
            lines.append(f"Install {'it' if len(packages) == 1 else 'them'} ({each.title}): "
                         f"{each.install} {' '.join(packages)}")
    unknown = [lib for lib in missing if lib not in PACKAGES]
    if unknown:
        lines.append(f"No package is known here for {', '.join(unknown)}: "
                     "your distribution's package search finds the one that provides it.")
    lines.append("Or use the API without a window: `make serve` or `paddock --headless`.")
    return "\n".join(lines)


def xcb_plugin() -> Path | None:
    """Qt's xcb platform plugin in the installed PySide6 (found on disk, without importing Qt), or None."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        plugin = Path(root) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def missing_xcb_libraries(plugin: Path | None = None) -> list[str] | None:
    """What the xcb plugin lacks per `ldd` (empty: nothing), or None when that cannot be told here
    (no plugin, no ldd: the caller falls back to Qt's own debug output)."""
    plugin = plugin or xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return None
    try:
        run = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return missing_from_ldd(run.stdout + run.stderr)


def read_os_release(path: Path = Path("/etc/os-release")) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
