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
