"""First run of an installed Studio: the user's folders in the platform's places, models found in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from studio.fake_hub import make_tiny_gguf

from app.studio.library import ModelLibrary, find_model
from app.studio.paths import ModelSource, other_model_sources, studio_paths

REPO = Path(__file__).resolve().parents[2]


def test_platform_folders_follow_xdg_and_none_is_inside_the_program(tmp_path):
    """The default folders are XDG's (asked in a child so platformdirs reads the environment fresh)."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
    env.pop("PADDOCK_HOME", None)
    code = ("from app.studio.paths import studio_paths\n"
            "p = studio_paths().ensure()\n"
            "print(p.config_dir, p.data_dir, p.cache_dir, p.models_dir, sep='\\n')\n"
            "print(*(s.path for s in p.other_models), sep='\\n')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.split("\n")
    assert lines[:4] == [str(tmp_path / "cfg/paddock-studio"), str(tmp_path / "data/paddock-studio"),
                         str(tmp_path / "cache/paddock-studio"), str(tmp_path / "data/paddock-studio/models")]
    assert all(Path(line).is_dir() for line in lines[:4])
    assert lines[4:7] == [str(tmp_path / "home/.lmstudio/models"), str(tmp_path / "home/.cache/lm-studio/models"),
                          str(tmp_path / "cache/huggingface/hub")]
    assert not any(Path(line).is_relative_to(REPO) for line in lines if line)


def test_a_chosen_home_keeps_other_applications_folders_out_of_reach(tmp_path):
    paths = studio_paths(tmp_path)
    assert paths.models_dir == tmp_path.resolve() / "models" and paths.other_models == ()


@pytest.mark.parametrize(("env", "expected"), [
    ({"HF_HUB_CACHE": "/hub-cache", "HF_HOME": "/hf-home"}, "/hub-cache"),
    ({"HF_HOME": "/hf-home", "XDG_CACHE_HOME": "/xdg"}, "/hf-home/hub"),
    ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/huggingface/hub"),
    ({}, "/u/.cache/huggingface/hub"),
])
def test_the_hub_cache_is_where_huggingface_hub_puts_it(env, expected):
    hub = other_model_sources(env, Path("/u"))[-1]
    assert (hub.label, hub.path, hub.layout) == ("Hugging Face cache", Path(expected), "hub")


@pytest.fixture
def elsewhere(tmp_path) -> tuple[ModelSource, ...]:
    """An LM Studio folder (two models, one also reached through a link) and a hub cache with two revisions."""
    lms = tmp_path / "lmstudio"
    (lms / "acme" / "Tiny-GGUF").mkdir(parents=True)
    make_tiny_gguf(lms / "acme" / "Tiny-GGUF" / "tiny-q8_0.gguf")
    (lms / "acme" / "Tiny-GGUF" / "tiny-q8_0.gguf.part").write_bytes(b"half a download")
    (lms / "mlx-community" / "Some-MLX").mkdir(parents=True)
    (lms / "mlx-community" / "Some-MLX" / "config.json").write_text("{}")
    old_lms = tmp_path / "old-lmstudio"
    old_lms.mkdir()
    (old_lms / "acme").symlink_to(lms / "acme")  # LM Studio links its old folder to the new one

    repo = tmp_path / "hub" / "models--bartowski--Small-GGUF"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    make_tiny_gguf(blobs / "aaa", context=4096)
    make_tiny_gguf(blobs / "bbb", context=1024)
    for revision, blob in (("rev-new", "aaa"), ("rev-old", "bbb")):
        (repo / "snapshots" / revision).mkdir(parents=True)
        (repo / "snapshots" / revision / "small-Q8_0.gguf").symlink_to(blobs / blob)
    (repo / "snapshots" / "rev-new" / "gone.gguf").symlink_to(blobs / "missing")  # blob deleted by hand
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev-new\n")
    return (ModelSource("LM Studio", lms, "tree"), ModelSource("LM Studio", old_lms, "tree"),
            ModelSource("Hugging Face cache", tmp_path / "hub", "hub"), ModelSource("Nowhere", tmp_path / "x", "tree"))


def test_models_in_other_applications_folders_are_offered_in_place(tmp_path, elsewhere):
    library = ModelLibrary(tmp_path / "models", elsewhere)
    found = {entry.name: entry for entry in library.found_elsewhere()}
    assert sorted(found) == ["Hugging Face cache: bartowski/Small-GGUF/small-Q8_0.gguf",
                             "LM Studio: acme/Tiny-GGUF/tiny-q8_0.gguf"]
    hub = found["Hugging Face cache: bartowski/Small-GGUF/small-Q8_0.gguf"]
    # the revision refs/main names, opened through the snapshot's link (its .gguf name), not copied
    assert hub.path == tmp_path / "hub/models--bartowski--Small-GGUF/snapshots/rev-new/small-Q8_0.gguf"
    assert (hub.context_length, hub.architecture, hub.location, hub.error) == (4096, "llama", "Hugging Face cache", None)
    assert found["LM Studio: acme/Tiny-GGUF/tiny-q8_0.gguf"].path == tmp_path / "lmstudio/acme/Tiny-GGUF/tiny-q8_0.gguf"
    assert library.list() == [] and not (tmp_path / "models").exists()


def test_a_model_already_in_the_library_is_not_listed_twice(tmp_path, elsewhere):
    library = ModelLibrary(tmp_path / "lmstudio", elsewhere)  # the user pointed the library at LM Studio's folder
    assert [e.name for e in library.list()] == ["acme/Tiny-GGUF/tiny-q8_0.gguf"]
    assert [e.name for e in library.found_elsewhere()] == ["Hugging Face cache: bartowski/Small-GGUF/small-Q8_0.gguf"]


def test_models_found_elsewhere_cannot_be_deleted_from_the_studio(tmp_path, elsewhere):
    library = ModelLibrary(tmp_path / "models", elsewhere)
    entry = library.found_elsewhere()[0]
    with pytest.raises(ValueError, match="not a model inside"):
        library.delete(entry)
    assert entry.path.is_file()


def test_the_command_line_finds_a_model_by_file_name_in_other_folders(tmp_path, elsewhere):
    assert find_model("small-Q8_0", tmp_path / "models", elsewhere) == (
        tmp_path / "hub/models--bartowski--Small-GGUF/snapshots/rev-new/small-Q8_0.gguf")
    assert find_model("nothing-like-it", tmp_path / "models", elsewhere) is None
