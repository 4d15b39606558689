"""installer/build_linux.sh from this checkout, then the built program run as a user would: `--version`,
`serve` on a loopback port answering from the embedded model, a clean stop, `install.sh` and back.
`make test-bundle` runs this file (CI runs it after `make test`, which leaves it out: marker `bundle`).

The bundle is built CPU-only (`--cuda none`: CI has no GPU) into a build venv of its own; the
first build installs the runtime dependencies and takes a few minutes, later ones reuse it. The
unpacked bundle's files are listed before the runs and compared after them: an installed program
never writes beside itself (permissions cannot show it: the tests may run as root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from bundle_layout import LAYOUT, REPO, archive_name, expected_paths

import app

# the first test builds the bundle (minutes: pip, PyInstaller, the archive), beyond pytest's 600 s default
pytestmark = [pytest.mark.bundle, pytest.mark.slow, pytest.mark.timeout(3600)]
REFERENCE = json.loads((REPO / "tests" / "fixtures" / "gemma" / "reference.json").read_text())
CASE = next(c for c in REFERENCE["cases"] if c["prompt"] == "La capitale de la France est")
BUILD_TIMEOUT_S = 45 * 60
READY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """The unpacked PaddockStudio-<version>/ folder from the archive the script made."""
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(["bash", str(REPO / "installer" / "build_linux.sh"), "--cuda", "none", "--out", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    print(build.stdout[-2000:])  # the script's timings and sizes, for the log
    tarball = out / archive_name("linux", app.__version__)
    assert build.stdout.strip().splitlines()[-1] == str(tarball)
    unpacked = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(tarball) as archive:
        archive.extractall(unpacked, filter="tar")
    folder = unpacked / f"PaddockStudio-{app.__version__}"
    BEFORE.update(listing(folder))
    return folder


BEFORE: dict[str, tuple[int, int]] = {}


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture
def user_env(tmp_path) -> dict[str, str]:
    """A first-run user: an empty home, no display, the platform's XDG defaults under that home."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "PADDOCK_", "HF_", "QT_")) and k not in ("DISPLAY", "WAYLAND_DISPLAY", "PYTHONPATH")}
    (tmp_path / "home").mkdir()
    return {**env, "HOME": str(tmp_path / "home")}


def test_the_bundle_holds_the_layout_and_nothing_it_should_not(bundle):
    for relative, source in expected_paths("linux").items():
        assert (bundle / relative).is_file(), f"{relative} is missing"
        if source is not None:
            assert (bundle / relative).read_bytes() == source.read_bytes()
    for extra in LAYOUT["archive"]["linux_extras"]:
        assert (bundle / extra).is_file()
    assert not {p.name for p in (bundle / "_internal").iterdir()} & set(LAYOUT["never"])


def test_version_names_the_cpu_and_the_driver_to_get(bundle, user_env):
    out = subprocess.run([str(bundle / "paddock"), "--version"], env=user_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"Paddock Studio {app.__version__} (installed bundle)"
    assert "engine backend: cpu: this installation has no CUDA support: CuPy is not installed" in lines
    assert "CuPy: not installed" in lines


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(base: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server exited with {server.returncode}: {server.stdout.read()}"
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server did not answer /health within {READY_TIMEOUT_S} s")


@pytest.fixture
def sigint_reaches_children():
    """The program under test starts with SIGINT at its default, as from a terminal. A shell without job
    control starts a background job (`make test &`) with SIGINT ignored, and an ignored signal stays
    ignored through exec: Python then never raises KeyboardInterrupt, and `serve` ends on Ctrl-C with 0,
    not 130. A handler in this process is reset to the default in the child instead."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_serve_answers_from_the_embedded_model_and_stops_cleanly(bundle, user_env, tmp_path, sigint_reaches_children):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(bundle / "paddock"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                              env=user_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(base, server)
        names = [card["id"] for card in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]]
        model = names[0]  # the chat model first, then the embedding and transcription models
        assert model == "gemma-3-270m-q4_k_m" and "whisper-1" in names
        embedding_model = next(name for name in names if "MiniLM" in name)
        # the same greedy tokens transformers produced from this GGUF (tests/fixtures/gemma/reference.json)
        reply = httpx.post(f"{base}/v1/completions", timeout=900, json={
            "model": model, "prompt": CASE["prompt_token_ids"], "max_tokens": len(CASE["greedy_token_ids"]),
            "temperature": 0, "ignore_eos": True}).json()
        assert reply["choices"][0]["text"] == CASE["text"]
        assert reply["usage"]["completion_tokens"] == len(CASE["greedy_token_ids"])
        vectors = httpx.post(f"{base}/v1/embeddings", timeout=120,
                             json={"model": embedding_model, "input": "a bundled embeddings model"}).json()
        # the same vector the source tree's embedder computes (the bundle carries the same MiniLM files)
        from app.engine.embeddings import load_default_embedder

        expected = load_default_embedder().embed(["a bundled embeddings model"])[0]
        np.testing.assert_allclose(vectors["data"][0]["embedding"], expected, atol=1e-5)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            output, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
            raise AssertionError(f"the server did not stop within 60 s of SIGINT:\n{output[-3000:]}") from None
    assert server.returncode == 130, output[-3000:]  # ended by Ctrl-C, after a complete shutdown
    assert "Application shutdown complete." in output and "Traceback" not in output, output[-3000:]


def test_install_sh_adds_the_menu_entry_for_this_user_and_uninstall_keeps_data(bundle, user_env, tmp_path):
    home = Path(user_env["HOME"])
    data = home / ".local/share/paddock-studio/models"
    data.mkdir(parents=True)
    (data / "mine.gguf").write_bytes(b"a user's model")
    subprocess.run([str(bundle / "install.sh")], env=user_env, check=True, capture_output=True, timeout=300)
    installed = home / ".local/lib/paddock-studio/paddock"
    entry = (home / ".local/share/applications/paddock-studio.desktop").read_text()
    assert f"Exec={installed}" in entry.splitlines()
    assert (home / ".local/share/icons/hicolor/256x256/apps/paddock.png").is_file()
    assert (home / ".local/bin/paddock").resolve() == installed.resolve()
    version = subprocess.run([str(home / ".local/bin/paddock"), "--version"], env=user_env, capture_output=True,
                             text=True, timeout=120)
    assert version.stdout.startswith(f"Paddock Studio {app.__version__}")
    subprocess.run([str(installed.parent / "install.sh"), "--uninstall"], env=user_env, check=True,
                   capture_output=True, timeout=120)
    assert not installed.exists() and not (home / ".local/share/applications/paddock-studio.desktop").exists()
    assert not (home / ".local/bin/paddock").exists() and (data / "mine.gguf").read_bytes() == b"a user's model"


@pytest.mark.skipif(not all(shutil.which(tool) for tool in ("Xvfb", "xdotool", "import")),
                    reason="needs xvfb, xdotool and imagemagick (apt-get install, shared/PLATFORM.md)")
def test_the_studio_opens_its_main_window_on_a_virtual_screen(bundle, tmp_path):
    shot = tmp_path / "studio.png"
    run = subprocess.run([str(REPO / "installer/linux/xvfb_screenshot.sh"), str(bundle), str(shot), "5"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "main window visible after" in run.stdout
    from PIL import Image

    colors = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # a drawn window (text, widgets), not a blank screen


def test_nothing_was_written_inside_the_bundle(bundle):
    assert listing(bundle) == BEFORE
