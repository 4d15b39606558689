"""What the speech mmproj readers share (models/audio/speech_mmproj.py): the audio projector type read from
the key clip.cpp reads it from, a file of another type refused naming the key it has, and the clip.audio.*
sizes refused unless they are positive integers."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engine.loader.names import CheckpointError
from app.engine.models.audio.speech_mmproj import audio_projector_type, audio_size, open_speech_mmproj


def _mmproj(path: Path, types: dict[str, str]) -> Path:
    """An mmproj of one tensor whose projector-type keys are `types`."""
    writer = gguf.GGUFWriter(str(path), "clip")
    for key, value in types.items():
        writer.add_string(key, value)
    writer.add_tensor("a.post_ln.weight", np.ones(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_audio_key_wins_where_a_file_has_both():
    assert (
        audio_projector_type({"clip.projector_type": "gemma4v", "clip.audio.projector_type": "gemma4a"})
        == "gemma4a"
    )
    assert audio_projector_type({"clip.projector_type": "granite_speech"}) == "granite_speech"
    assert audio_projector_type({}) is None


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"clip.projector_type": "gemma3"}, "clip.projector_type is 'gemma3'"),
        ({"clip.projector_type": "qwen3a", "clip.audio.projector_type": "qwen2a"},
         "clip.audio.projector_type is 'qwen2a'"),
    ],
)  # fmt: skip
def test_another_projector_type_is_refused_naming_the_file_and_key(tmp_path, keys, named):
    path = _mmproj(tmp_path / "mmproj.gguf", keys)
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: {named}, not 'qwen3a' (Qwen3-ASR)")):
        open_speech_mmproj(path, "qwen3a", "Qwen3-ASR")


def test_the_family_s_file_opens(tmp_path):
    path = _mmproj(tmp_path / "mmproj.gguf", {"clip.projector_type": "granite_speech"})
    assert set(open_speech_mmproj(path, "granite_speech", "Granite Speech").tensors) == {"a.post_ln.weight"}


@pytest.mark.parametrize("value", [None, 0, -3, True, 2.5, "8"])
def test_a_size_that_is_no_positive_integer_is_refused(value):
    meta = {} if value is None else {"clip.audio.block_count": value}
    with pytest.raises(
        CheckpointError, match=re.escape(f"m.gguf: clip.audio.block_count is {value!r}, not a positive")
    ):
        audio_size(Path("m.gguf"), meta, "block_count")


def test_sizes_as_the_reader_gives_them_are_read():
    assert audio_size(Path("m.gguf"), {"clip.audio.block_count": np.uint32(4)}, "block_count") == 4
    assert audio_size(Path("m.gguf"), {"clip.audio.block_count": 24}, "block_count") == 24
