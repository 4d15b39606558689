"""Search, listing and downloads against a local imitation of the Hugging Face hub."""

from __future__ import annotations

import hashlib
import json
import socket

import numpy as np
import pytest
from fake_hub import FakeHub, git_blob_id, make_tiny_gguf
from safetensors.numpy import save as save_safetensors

from app.studio.downloads import ChecksumMismatch, DownloadError, HubClient, bytes_present, model_folder
from app.studio.library import ModelLibrary
from app.studio.tasks import CancelToken, SyncExecutor, TaskCancelled

GGUF_REPO, HF_REPO, GGUF_NAME = "acme/tiny-GGUF", "acme/tiny-hf", "tiny-Q8_0.gguf"
SPLIT_REPO = "acme/split-GGUF"
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 300,
             "max_position_embeddings": 1024}


@pytest.fixture
def hub(tmp_path_factory, monkeypatch):
    gguf_path = tmp_path_factory.mktemp("src") / GGUF_NAME
    gguf_bytes = make_tiny_gguf(gguf_path)
    weights = save_safetensors({"model.embed_tokens.weight": np.ones((300, 64), dtype=np.float32)})
    fake = FakeHub()
    fake.add_repo(GGUF_REPO, {GGUF_NAME: gguf_bytes, "README.md": b"# tiny\n"}, tags=("gguf",), downloads=100)
    fake.add_repo(HF_REPO, {"config.json": json.dumps(HF_CONFIG).encode(), "model.safetensors": weights,
                            "tokenizer.json": b"{}", "README.md": b"# hf\n"}, downloads=10)
    fake.add_repo(SPLIT_REPO, {"m-00001-of-00002.gguf": gguf_bytes, "m-00002-of-00002.gguf": gguf_bytes,
                               "mmproj-m-f16.gguf": gguf_bytes}, tags=("gguf",))
    fake.gguf_path = gguf_path  # the same file, locally, to compare the remote probe with
    fake.serve(monkeypatch)
    yield fake
    fake.stop()


@pytest.fixture
def client(hub) -> HubClient:
    return HubClient(token=None)


def test_search_orders_by_downloads_and_filters_gguf(client):
    assert [h.repo_id for h in client.search("tiny")] == [GGUF_REPO, HF_REPO]
    hits = client.search("tiny", gguf_only=True)
    assert [h.repo_id for h in hits] == [GGUF_REPO] and hits[0].has_gguf


def test_listing_shows_sizes_and_checksums_before_download(client, hub):
    listing = client.list_files(GGUF_REPO)
    gguf_file = listing.file(GGUF_NAME)
    data = hub.repos[GGUF_REPO].files[GGUF_NAME]
    assert gguf_file.size == len(data)
    assert gguf_file.sha256 == hashlib.sha256(data).hexdigest()
    readme = listing.file("README.md")
    assert readme.sha256 is None and readme.blob_id == git_blob_id(b"# tiny\n")
    assert listing.revision == hub.repos[GGUF_REPO].sha
    assert listing.default_selection() == []  # a GGUF repo: the user picks a file
    hf = client.list_files(HF_REPO)
    assert {f.path for f in hf.default_selection()} == {"config.json", "model.safetensors", "tokenizer.json"}


def test_a_safetensors_model_comes_with_its_processor_and_pooling_settings(client, hub):
    # transformers 5 keeps image processor settings in processor_config.json; sentence-transformers
    # embedders keep their pooling in 1_Pooling/ and their query prompt beside it
    extras = ["processor_config.json", "preprocessor_config.json", "modules.json", "1_Pooling/config.json",
              "config_sentence_transformers.json"]  # fmt: skip
    files = {"config.json": b"{}", "model.safetensors": b"x", **{name: b"{}" for name in extras},
             "README.md": b"#", "2_Normalize/notes.txt": b"-"}  # fmt: skip
    hub.add_repo("tiny/embedder", files)
    chosen = {f.path for f in client.list_files("tiny/embedder").default_selection()}
    assert chosen == {"config.json", "model.safetensors", *extras}


def test_download_with_progress_lands_as_a_standard_file(client, hub, tmp_path):
    listing = client.list_files(GGUF_REPO)
    seen = []
    [path] = client.download(listing, [GGUF_NAME], tmp_path, progress=seen.append)
    assert path == model_folder(tmp_path, GGUF_REPO) / GGUF_NAME
    assert path.read_bytes() == hub.repos[GGUF_REPO].files[GGUF_NAME]
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert seen[-1].fraction == 1.0 and seen[-1].message == GGUF_NAME
    assert [p.name for p in path.parent.iterdir()] == [GGUF_NAME]  # no .part or sidecar left
    [entry] = ModelLibrary(tmp_path).list()
    assert entry.name == f"{GGUF_REPO}/{GGUF_NAME}" and entry.architecture == "llama"


def test_interrupted_download_resumes_with_a_range_request(client, hub, tmp_path):
    listing = client.list_files(GGUF_REPO)
    hub.drop_after[GGUF_NAME] = 40_000
    with pytest.raises(DownloadError, match="resume"):
        client.download(listing, [GGUF_NAME], tmp_path)
    part = model_folder(tmp_path, GGUF_REPO) / (GGUF_NAME + ".part")
    assert part.stat().st_size == 40_000 == bytes_present(tmp_path, listing, listing.file(GGUF_NAME))
    assert not (model_folder(tmp_path, GGUF_REPO) / GGUF_NAME).exists()

    [path] = client.download(listing, [GGUF_NAME], tmp_path)  # a new attempt, as after a restart
    assert path.read_bytes() == hub.repos[GGUF_REPO].files[GGUF_NAME]
    assert hub.ranges_for(GGUF_NAME)[-1] == "bytes=40000-"
    assert not part.exists()


def test_cancel_keeps_the_part_and_a_later_start_resumes(client, hub, tmp_path):
    listing = client.list_files(GGUF_REPO)
    token = CancelToken()

    def cancel_after_first_chunk(progress):
        if progress.done > 0:
            token.cancel()

    with pytest.raises(TaskCancelled):
        client.download(listing, [GGUF_NAME], tmp_path, progress=cancel_after_first_chunk, token=token)
    part = model_folder(tmp_path, GGUF_REPO) / (GGUF_NAME + ".part")
    kept = part.stat().st_size
    assert 0 < kept < len(hub.repos[GGUF_REPO].files[GGUF_NAME])

    result = SyncExecutor().submit(lambda ctx: client.download(listing, [GGUF_NAME], tmp_path,
                                                               progress=ctx.progress_callback()))
    assert result.result().ok
    assert hub.ranges_for(GGUF_NAME)[-1] == f"bytes={kept}-"
    assert result.result().value[0].read_bytes() == hub.repos[GGUF_REPO].files[GGUF_NAME]


def test_checksum_mismatch_is_an_error_and_leaves_nothing(client, hub, tmp_path):
    listing = client.list_files(HF_REPO)
    good = hub.repos[HF_REPO].files["model.safetensors"]
    hub.corrupt["model.safetensors"] = bytes(len(good))  # right size, wrong bytes
    with pytest.raises(ChecksumMismatch, match="sha256"):
        client.download(listing, listing.default_selection(), tmp_path)
    folder = model_folder(tmp_path, HF_REPO)
    assert not (folder / "model.safetensors").exists()
    assert not (folder / "model.safetensors.part").exists()
    assert (folder / "config.json").exists()  # verified files before it are kept

    del hub.corrupt["model.safetensors"]
    client.download(listing, listing.default_selection(), tmp_path)
    [entry] = ModelLibrary(tmp_path).list()
    assert entry.format == "safetensors" and entry.parameters == 300 * 64 and entry.quantization == "F32"


def test_readable_errors_for_missing_gated_and_unreachable(client, hub):
    with pytest.raises(DownloadError, match="not found"):
        client.list_files("acme/nothing")
    hub.gated.add(GGUF_REPO)
    with pytest.raises(DownloadError, match="gated"):
        client.list_files(GGUF_REPO)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with pytest.raises(DownloadError, match="cannot reach"):
        HubClient(endpoint=f"http://127.0.0.1:{closed_port}").list_files(GGUF_REPO)


def test_probe_reads_only_the_gguf_header_with_range_requests(client, hub, tmp_path, monkeypatch):
    monkeypatch.setattr("app.studio.downloads._GGUF_PROBE_PIECE", 1024)  # force several requests
    listing = client.list_files(GGUF_REPO)
    remote = client.probe_model(listing, GGUF_NAME)
    ranges = hub.ranges_for(GGUF_NAME)
    assert len(ranges) > 1 and ranges[:2] == ["bytes=0-1023", "bytes=1024-2047"]
    fetched_up_to = int(ranges[-1].split("-")[1])
    assert fetched_up_to < len(hub.repos[GGUF_REPO].files[GGUF_NAME]) // 4  # the header, not the weights
    assert remote.shape.num_layers == 2 and remote.shape.num_kv_heads == 2 and remote.shape.vocab_size == 300
    assert remote.quantization == "Q8_0" and remote.architecture == "llama"
    assert not model_folder(tmp_path, GGUF_REPO).exists()  # nothing downloaded
    assert remote.shape == ModelLibrary(tmp_path).describe(hub.gguf_path).shape


def test_probe_of_a_safetensors_repo_uses_config_and_file_sizes(client, hub):
    listing = client.list_files(HF_REPO)
    remote = client.probe_model(listing)
    assert remote.shape.hidden_size == 64 and remote.shape.context_length == 1024
    assert remote.shape.weight_bytes == len(hub.repos[HF_REPO].files["model.safetensors"])


def test_paddock_models_and_fit_commands(hub, tmp_path, monkeypatch, capsys):
    from app.cli import main as paddock

    monkeypatch.setenv("PADDOCK_HOME", str(tmp_path))
    assert paddock(["fit", GGUF_REPO, "--json"]) == 0  # before download: from the header over HTTP
    assert json.loads(capsys.readouterr().out)["model"] == f"{GGUF_REPO} {GGUF_NAME} (not downloaded)"
    assert paddock(["models", "search", "tiny", "--gguf"]) == 0
    assert GGUF_REPO in capsys.readouterr().out
    assert paddock(["models", "files", HF_REPO]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    assert paddock(["models", "download", GGUF_REPO]) == 0  # its only GGUF file is picked
    assert capsys.readouterr().out.strip().endswith(f"{GGUF_REPO}/{GGUF_NAME}")
    assert paddock(["models"]) == 0
    listing = capsys.readouterr().out
    assert f"{GGUF_REPO}/{GGUF_NAME}" in listing and "Q8_0" in listing and "llama" in listing
    assert paddock(["models", "download", "acme/missing"]) == 1
    assert "not found" in capsys.readouterr().err
    assert paddock(["models", "delete", GGUF_NAME]) == 0
    assert not (tmp_path / "models" / "acme").exists()


def test_split_gguf_is_one_model_of_several_files(client, hub, tmp_path):
    listing = client.list_files(SPLIT_REPO)
    assert [f.path for f in listing.gguf_models] == ["m-00001-of-00002.gguf"]  # no second shard, no projector
    shards = listing.files_for("m-00001-of-00002.gguf", vision=False)
    assert [f.path for f in shards] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert listing.files_for("m-00001-of-00002.gguf") == [*shards, listing.file("mmproj-m-f16.gguf")]
    remote = client.probe_model(listing)
    one = ModelLibrary(tmp_path).describe(hub.gguf_path).shape.weight_bytes
    assert remote.shape.weight_bytes == one + shards[1].size  # later shards counted by their size
    client.download(listing, shards, tmp_path)
    [entry] = ModelLibrary(tmp_path).list()
    assert len(entry.files) == 2 and entry.shape.weight_bytes == 2 * one
