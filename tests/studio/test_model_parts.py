"""model_parts.py: the files one model is made of, shared by the library and the file checks."""

from pathlib import Path

from app.studio.model_check import check_model_path
from app.studio.model_parts import gguf_shards, model_files


def test_a_split_gguf_is_every_shard_whichever_one_is_named(tmp_path: Path) -> None:
    named = tmp_path / "m-00002-of-00003.gguf"
    assert gguf_shards(named) == tuple(tmp_path / f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert model_files(tmp_path / "single.gguf") == (tmp_path / "single.gguf",)


def test_a_safetensors_folder_is_itself_then_its_files_in_order(tmp_path: Path) -> None:
    for name in ("b.safetensors", "a.safetensors", "config.json"):
        (tmp_path / name).write_bytes(b"")
    assert model_files(tmp_path) == (tmp_path, tmp_path / "a.safetensors", tmp_path / "b.safetensors")


def test_a_missing_shard_is_reported_by_the_check_of_any_shard(tmp_path: Path) -> None:
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(b"GGUF")
    problem = check_model_path(tmp_path / "m-00002-of-00002.gguf")
    assert problem is not None and problem.incomplete and problem.detail == "m-00001-of-00002.gguf is missing"


def _safetensors(path: Path, data_bytes: int, declared_end: int) -> None:
    import json
    import struct

    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [declared_end // 4], "data_offsets": [0, declared_end]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(data_bytes))


def test_a_safetensors_file_short_of_its_tensors_is_incomplete(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    _safetensors(tmp_path / "model.safetensors", data_bytes=16, declared_end=16)
    assert check_model_path(tmp_path) is None
    _safetensors(tmp_path / "model.safetensors", data_bytes=8, declared_end=16)
    problem = check_model_path(tmp_path)
    assert problem is not None and problem.incomplete and "its tensors need" in problem.detail


def test_a_safetensors_header_that_lies_is_corrupt_in_the_loaders_words(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes((10_000).to_bytes(8, "little") + b"{}")
    problem = check_model_path(tmp_path)
    assert problem is not None and not problem.incomplete
    assert "header length 10000 does not fit the 10-byte file" in problem.detail
