"""A GGUF repo with mmproj files, on the local imitation of the hub: the model's download takes its
mmproj along (the same pick for every quantization, from the model's own folder), the fit probe
reads the projector's header over HTTP, and the library then lists one model that takes images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_hub import FakeHub

from app.cli import main as paddock
from app.engine.models.vision.weights import find_mmproj
from app.engine.plan.fit import check_fit, shape_from_checkpoint
from app.studio.downloads import HubClient, model_folder
from app.studio.library import ModelLibrary
from app.studio.mmproj import pick_mmproj
from app.studio.tasks import CancelToken

FIXTURES = Path(__file__).parents[1] / "fixtures"
GEMMA = (FIXTURES / "families" / "gemma3" / "gemma3-f16.gguf").read_bytes()
MMPROJ = (FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf").read_bytes()
REPO = "acme/gemma-vision-GGUF"


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    fake.add_repo(REPO, {
        "gemma-3-tiny-F16.gguf": GEMMA, "gemma-3-tiny-Q8_0.gguf": GEMMA,
        "mmproj-gemma-3-tiny-BF16.gguf": MMPROJ, "mmproj-gemma-3-tiny-F16.gguf": MMPROJ,
        "mmproj-gemma-3-tiny-F32.gguf": MMPROJ + b"\0" * 64, "README.md": b"# tiny vision\n",
    }, tags=("gguf",))
    fake.serve(monkeypatch)
    yield fake
    fake.stop()


def test_the_models_download_takes_its_mmproj_and_the_library_lists_it_as_taking_images(hub, tmp_path):
    client = HubClient(token=None)
    listing = client.list_files(REPO)
    assert [f.path for f in listing.gguf_models] == ["gemma-3-tiny-F16.gguf", "gemma-3-tiny-Q8_0.gguf"]
    # both quantizations get the same projector: downloaded side by side they share it
    for model in ("gemma-3-tiny-F16.gguf", "gemma-3-tiny-Q8_0.gguf"):
        assert listing.mmproj_for(model).path == "mmproj-gemma-3-tiny-F16.gguf"
        assert [f.path for f in listing.files_for(model)] == [model, "mmproj-gemma-3-tiny-F16.gguf"]
        assert [f.path for f in listing.files_for(model, vision=False)] == [model]

    remote = client.probe_model(listing, "gemma-3-tiny-Q8_0.gguf")  # before the download: over HTTP ranges
    assert [f.path for f in remote.files] == ["gemma-3-tiny-Q8_0.gguf", "mmproj-gemma-3-tiny-F16.gguf"]
    assert remote.shape.vision is not None and remote.shape.vision.source == "mmproj-gemma-3-tiny-F16.gguf"
    assert remote.job == "chat + images" and client.probe_model(listing, "gemma-3-tiny-Q8_0.gguf", vision=False).job == "chat"
    assert not any(path.startswith("mmproj-gemma-3-tiny-F16") and rng is None for path, rng in hub.served)

    client.download(listing, listing.files_for("gemma-3-tiny-Q8_0.gguf"), tmp_path, token=CancelToken())
    folder = model_folder(tmp_path, REPO)
    assert sorted(p.name for p in folder.iterdir()) == ["gemma-3-tiny-Q8_0.gguf", "mmproj-gemma-3-tiny-F16.gguf"]
    assert find_mmproj(folder / "gemma-3-tiny-Q8_0.gguf") == folder / "mmproj-gemma-3-tiny-F16.gguf"  # the loader's
    [entry] = ModelLibrary(tmp_path).list()  # the projector is part of the model, not a model of its own
    assert entry.name == f"{REPO}/gemma-3-tiny-Q8_0.gguf"
    assert entry.takes_images and entry.vision == "mmproj-gemma-3-tiny-F16.gguf" and entry.error is None
    assert entry.job == remote.job  # what it does: the same from the hub probe and on disk
    local = shape_from_checkpoint(entry.path)
    assert entry.shape.vision == local.vision == remote.shape.vision  # library, loader and hub probe agree
    assert check_fit(entry.shape).breakdown.vision_weights == local.vision.weight_bytes > 0


def test_a_model_without_an_mmproj_is_listed_as_text_only(hub, tmp_path):
    client = HubClient(token=None)
    listing = client.list_files(REPO)
    client.download(listing, listing.files_for("gemma-3-tiny-F16.gguf", vision=False), tmp_path)
    [entry] = ModelLibrary(tmp_path).list()
    assert not entry.takes_images and entry.shape.vision is None
    # the mmproj arriving later (a second download) gives the listed model its vision
    client.download(listing, [listing.mmproj_for("gemma-3-tiny-F16.gguf")], tmp_path)
    [entry] = ModelLibrary(tmp_path).list()
    assert entry.takes_images


def test_the_pick_stays_in_the_models_folder():
    class File:
        def __init__(self, path: str, size: int = 1) -> None:
            self.path, self.size = path, size

    files = [File("q4/model-Q4_K_M.gguf"), File("mmproj-F16.gguf"), File("q4/mmproj-model-q8_0.gguf"),
             File("q4/mmproj-model-f32.gguf", 9), File("q4/mmproj-model-f16.gguf", 5)]
    assert pick_mmproj(files, "q4/model-Q4_K_M.gguf").path == "q4/mmproj-model-f16.gguf"
    assert pick_mmproj(files, "model.gguf").path == "mmproj-F16.gguf"
    assert pick_mmproj(files, "other/model.gguf") is None  # the loader would not find one elsewhere
    assert pick_mmproj(files, "mmproj-F16.gguf") is None  # a projector has no projector
    assert pick_mmproj(files[:1] + files[2:4], "q4/model-Q4_K_M.gguf").path == "q4/mmproj-model-f32.gguf"
    assert pick_mmproj(files[:1] + files[2:3], "q4/model-Q4_K_M.gguf").path == "q4/mmproj-model-q8_0.gguf"


def test_a_task_model_on_the_hub_is_read_as_one_before_download(monkeypatch, capsys):
    """The hub probe reads a reranker GGUF's pooling type and head from its header over HTTP ranges, and
    `paddock fit owner/repo` plans it as the engine runs a reranker (one text of 8,192 tokens)."""
    fake = FakeHub()
    fake.add_repo("acme/reranker-GGUF", {"model.gguf": (FIXTURES / "qwen3_tasks" / "reranker-f16.gguf").read_bytes()},
                  tags=("gguf",))  # fmt: skip
    fake.serve(monkeypatch)
    try:
        client = HubClient(token=None)
        assert client.probe_model(client.list_files("acme/reranker-GGUF")).job == "reranking"
        assert paddock(["fit", "acme/reranker-GGUF", "--device", "cpu", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["job"] == "reranking" and report["kv_blocks"] == 8192 // 16 + 1
    finally:
        fake.stop()
