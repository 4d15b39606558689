"""read_gguf_header: the header alone from a stream (the Studio's listing and hub probe), read_gguf's values."""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from app.engine.loader.gguf import read_gguf, read_gguf_header
from app.engine.loader.names import CheckpointError

VOCAB = [f"tok{i}" for i in range(5000)]


class _CountingReader(io.RawIOBase):
    """A file read through at most `piece` bytes a call (as over HTTP ranges), counting what was read."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.data, self.piece, self.pos = data, piece, 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.pos : self.pos + min(n, self.piece)]
        self.pos += len(chunk)
        return chunk


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 MiB of tensor data behind a header with a 5,000-token vocabulary and an unsupported type."""
    path = tmp_path_factory.mktemp("gguf") / "big.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_array("tokenizer.ggml.tokens", VOCAB)
    writer.add_tensor("token_embd.weight", np.zeros((2048, 4096), np.float32))
    q2k = np.zeros((4, 84), np.uint8)  # one Q2_K block per row: listed, though the engine cannot run it
    writer.add_tensor("blk.0.ffn_down.weight", q2k, raw_dtype=GGMLQuantizationType.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_only_is_read_and_agrees_with_the_loader(big_gguf: Path) -> None:
    data = big_gguf.read_bytes()
    for piece in (1 << 30, 1024):  # a local file, then short reads as from the hub
        stream = _CountingReader(data, piece)
        version, metadata, tensors = read_gguf_header(stream)
        assert stream.pos < len(data) // 2, "the tensor data was read"
        assert version == 3 and metadata["tokenizer.ggml.tokens"] == VOCAB
        assert metadata["general.architecture"] == "llama" and metadata["llama.block_count"] == 1
        assert [(name, dims, type_id) for name, dims, type_id, _ in tensors] == [
            ("token_embd.weight", (4096, 2048), GGMLQuantizationType.F32),
            ("blk.0.ffn_down.weight", (256, 4), GGMLQuantizationType.Q2_K),
        ]
    with pytest.raises(CheckpointError, match="Q2_K"):  # the full reader refuses what it cannot run
        read_gguf(big_gguf)


def test_same_metadata_as_read_gguf(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_float32("qwen3.rope.freq_base", 1e6)
    writer.add_string("general.name", "héllo ✓")
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with path.open("rb") as stream:
        _, metadata, tensors = read_gguf_header(stream)
    assert metadata == read_gguf(path).metadata
    assert tensors == [("output_norm.weight", (64,), GGMLQuantizationType.F32, 0)]


def test_a_stream_that_ends_inside_the_header_is_an_eof_error(big_gguf: Path) -> None:
    head = big_gguf.read_bytes()[:20_000]  # inside the vocabulary
    with pytest.raises(EOFError, match="ends inside its GGUF header"):
        read_gguf_header(io.BytesIO(head))
    with pytest.raises(EOFError):
        read_gguf_header(io.BytesIO(b""))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        read_gguf_header(io.BytesIO(b"PK\x03\x04" + bytes(100)))
