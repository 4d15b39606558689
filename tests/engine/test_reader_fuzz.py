"""Fuzzing the model-file readers with hypothesis: whatever the bytes, opening a GGUF file or a
safetensors file and parsing its config either succeeds or raises CheckpointError (a one-line
message), never another exception. Bounded (a few hundred examples, derandomized) so it runs in CI."""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.loader.finite import check_finite
from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import UnsupportedArchitecture, model_config

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
GGUF_BYTES = (FAMILIES / "qwen3" / "qwen3-kquants.gguf").read_bytes()
SAFETENSORS_BYTES = (FAMILIES / "qwen3" / "hf" / "model.safetensors").read_bytes()
HEADER_END = 8 * 1024  # the fixture's header and its first tensors: where a flip changes the most
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
INTERESTING_U64 = st.sampled_from([0, 1, 3, 2**31, 2**32, 2**40, 2**56, 2**63, 2**64 - 1])

Edit = tuple[str, int, int]  # (kind, position, value)


def _u32_value_positions(data: bytes) -> list[int]:
    """Where the header's uint32 metadata values lie (block_count, head counts, ...): after the key and its type."""
    positions = []
    for key in (b"context_length", b"embedding_length", b"block_count", b"feed_forward_length",
                b"head_count", b"head_count_kv", b"key_length", b"vocab_size", b"eos_token_id"):  # fmt: skip
        at = data.find(key + struct.pack("<I", 4))  # 4: GGUF's UINT32 type id
        if at >= 0:
            positions.append(at + len(key) + 4)
    return positions


U32_VALUES = _u32_value_positions(GGUF_BYTES)
edits = st.lists(
    st.one_of(
        st.tuples(
            st.just("u32"),
            st.sampled_from(U32_VALUES),
            st.sampled_from([0, 1, 3, 7, 2**16, 2**31, 2**32 - 1]),
        ),
        st.tuples(st.just("byte"), st.integers(0, HEADER_END), st.integers(0, 255)),
        st.tuples(st.just("u64"), st.integers(0, HEADER_END), INTERESTING_U64),
        st.tuples(st.just("cut"), st.integers(0, len(GGUF_BYTES)), st.just(0)),
    ),
    min_size=1,
    max_size=6,
)


def mutate(data: bytes, changes: list[Edit]) -> bytes:
    out = bytearray(data)
    for kind, position, value in changes:
        position = min(position, len(out))
        if kind == "byte" and position < len(out):
            out[position] = value
        elif kind == "u64" and position + 8 <= len(out):
            out[position : position + 8] = struct.pack("<Q", value)
        elif kind == "u32" and position + 4 <= len(out):
            out[position : position + 4] = struct.pack("<I", value)
        elif kind == "cut":
            del out[position:]
    return bytes(out)


def load(path: Path) -> None:
    """What the engine does with a file before it allocates anything for the model."""
    checkpoint = open_checkpoint(path)
    check_finite(checkpoint.tensors, path)
    model_config(checkpoint)


def opens_or_refuses(data: bytes, name: str, read: Callable[[Path], object], *also: type[Exception]) -> None:
    """`read` a file of these bytes: it returns, or raises a one-line CheckpointError (or one of `also`)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            read(path)
        except (CheckpointError, *also) as exc:
            assert "\n" not in str(exc)


@FUZZ
@given(changes=edits)
def test_a_mutated_gguf_file_opens_or_is_refused_with_a_checkpoint_error(changes: list[Edit]) -> None:
    opens_or_refuses(mutate(GGUF_BYTES, changes), "fuzz.gguf", load, UnsupportedArchitecture)


dimension = st.one_of(
    st.integers(0, 64),
    st.sampled_from([-1, 2**31, 2**32, 2**40, 2**63, 2**64, 2**70]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
dimensions = st.one_of(st.lists(dimension, max_size=10), dimension)
entries = st.fixed_dictionaries(
    {
        "dtype": st.one_of(
            st.sampled_from(["F32", "F16", "BF16", "I8", "F64"]), st.integers(), st.lists(st.text())
        ),
        "shape": dimensions,
        "data_offsets": st.one_of(st.tuples(dimension, dimension).map(list), dimensions),
    }
)
headers = st.dictionaries(
    st.sampled_from(["model.embed_tokens.weight", "lm_head.weight", "x"]), entries, min_size=1
)


@FUZZ
@given(header=headers, data_size=st.integers(0, 4096))
def test_a_fuzzed_safetensors_header_opens_or_is_refused_with_a_checkpoint_error(header, data_size) -> None:
    encoded = json.dumps(header).encode()
    data = struct.pack("<Q", len(encoded)) + encoded + bytes(data_size)
    opens_or_refuses(data, "model.safetensors", read_safetensors_file)


@FUZZ
@given(changes=edits)
def test_mutated_safetensors_bytes_open_or_are_refused_with_a_checkpoint_error(changes: list[Edit]) -> None:
    opens_or_refuses(mutate(SAFETENSORS_BYTES, changes), "model.safetensors", read_safetensors_file)
