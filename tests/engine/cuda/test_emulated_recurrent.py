"""The hybrid models' recurrent kernels (causal_conv1d.cu, gated_delta.cu) on the SIMT emulator
(host/recurrent_main.cpp), against the numpy reference of backend/recurrent_reference.py.

Not marked `gpu`: these run in CI. The references are float32 numpy; the kernels do the same float32
operations per element, in the same order where the reference has one (the conv's taps), so the
tolerances are a few float32 ulps grown by the number of terms summed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.recurrent_reference import causal_conv1d

pytestmark = pytest.mark.slow  # kernels run thread by thread on the CPU

NUM_SLOTS = 6


@pytest.fixture(scope="module")
def recurrent_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "recurrent_main.cpp")


def varlen_meta(lengths: list[int], slots: list[int], initial: list[bool]) -> AttentionMetadata:
    """A batch's metadata as the runner makes it, with the host copies the reference walks."""
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(qsl[-1])
    return AttentionMetadata(
        query_start_loc=qsl, seq_lens=np.array(lengths, np.int32), block_tables=np.zeros((len(lengths), 1), np.int32),
        slot_mapping=np.zeros(n, np.int32), positions=np.zeros(n, np.int32), max_query_len=max(lengths),
        max_seq_len=max(lengths), block_size=16, host_query_start_loc=qsl,
        state_slots=np.array(slots, np.int32), has_initial_state=np.array(initial, bool),
        host_state_slots=np.array(slots, np.int32), host_has_initial_state=np.array(initial, bool),
    )  # fmt: skip


def write_meta(folder: Path, meta: AttentionMetadata) -> None:
    meta.host_query_start_loc.tofile(folder / "qsl.bin")
    meta.host_state_slots.tofile(folder / "slots.bin")
    meta.host_has_initial_state.astype(np.uint8).tofile(folder / "init.bin")


@pytest.mark.parametrize(("lengths", "initial", "k", "bias", "silu"), [
    ([7, 1, 19, 3], [True, False, False, True], 4, False, True),  # Gated DeltaNet's conv
    ([2, 33], [False, True], 4, True, True),  # Mamba-2's (a bias)
    ([5, 1, 1], [True, True, False], 3, True, False),  # shorter than K-1 continues the older inputs
    ([1, 1, 1, 1], [True, False, True, True], 4, False, True),  # a decode-shaped batch through varlen
])  # fmt: skip
def test_causal_conv1d_varlen_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, lengths, initial, k, bias, silu
) -> None:
    """Each sequence's rows continue its own state row (or zeros) and leave its last K-1 inputs there;
    rows of other slots are untouched."""
    rng, seed = fresh_rng(request.node.nodeid)
    channels = 200  # not a multiple of the block: the last block's threads past C do nothing
    slots = list(rng.permutation(NUM_SLOTS)[: len(lengths)].astype(int))
    meta = varlen_meta(lengths, slots, initial)
    x = rng.standard_normal((sum(lengths), channels)).astype(np.float32)
    w = rng.standard_normal((channels, k)).astype(np.float32) * np.float32(0.5)
    b = rng.standard_normal(channels).astype(np.float32) if bias else None
    state = rng.standard_normal((NUM_SLOTS, channels, k - 1)).astype(np.float32)
    for name, a in (("x", x), ("w", w), ("state", state)) + ((("bias", b),) if bias else ()):
        a.tofile(tmp_path / f"{name}.bin")
    write_meta(tmp_path, meta)
    ref_state = state.copy()
    ref = causal_conv1d(np, x, w, b, ref_state, meta, silu=silu)
    _run(recurrent_emu, "conv", tmp_path, len(x), len(lengths), channels, k, int(silu), 0, 64)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "state.bin", np.float32).reshape(state.shape), ref_state)


def test_causal_conv1d_decode_emulated(request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path) -> None:
    """The decode entry (row i is sequence i's token, no query_start_loc read) matches the reference's
    batched step; a negative slot (a padding row of a captured batch) is skipped and writes nothing."""
    rng, seed = fresh_rng(request.node.nodeid)
    channels, k = 96, 4
    initial = [True, False, True, True]
    meta = varlen_meta([1] * 4, [4, 0, 2, 5], initial)
    x = rng.standard_normal((4, channels)).astype(np.float32)
    w = rng.standard_normal((channels, k)).astype(np.float32)
    state = rng.standard_normal((NUM_SLOTS, channels, k - 1)).astype(np.float32)
    ref_state = state.copy()
    ref = causal_conv1d(np, x, w, None, ref_state, meta, silu=True)
    slots = meta.host_state_slots.copy()
    slots[1] = -1  # sequence 1 is padding for the kernel
    meta.host_state_slots = slots
    for name, a in (("x", x), ("w", w), ("state", state)):
        a.tofile(tmp_path / f"{name}.bin")
    write_meta(tmp_path, meta)
    _run(recurrent_emu, "conv", tmp_path, 4, 4, channels, k, 1, 1, 32)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    real = [0, 2, 3]
    assert rel_err(got[real], ref[real]) < 1e-6, f"seed={seed}"
    assert np.isnan(got[1]).all()  # the padding row is not written
    got_state = np.fromfile(tmp_path / "state.bin", np.float32).reshape(state.shape)
    np.testing.assert_array_equal(got_state[[4, 2, 5]], ref_state[[4, 2, 5]])
    np.testing.assert_array_equal(got_state[[0, 1, 3]], state[[0, 1, 3]])  # slot 0 was the padding row's
