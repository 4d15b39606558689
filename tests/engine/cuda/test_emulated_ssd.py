"""ssd.cu (Mamba-2's scan and gated group norm) on the SIMT emulator, against the numpy backend.

The scan's inputs are laid out as the layer hands them over: x, B and C column ranges of one conv
output row, dt a column range of a wider projection row, so the kernel's row strides are checked
too. Batches mix sequences that continue their state row with ones that start from zeros (whose
row holds garbage that must not be read), prefill chunks with one-token decodes, and state rows no
sequence owns (which must stay as they were).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.ssd import SSD_ROWS, norm_threads

pytestmark = pytest.mark.slow  # the emulator runs every CUDA thread as a fiber

_builds: dict[int, Path] = {}


def _emulator(tmp_path_factory: pytest.TempPathFactory, d_state: int) -> Path:
    """The harness compiled for `d_state` (the wrapper's SSD_NJ: state columns per lane / 32)."""
    nj = -(-d_state // 32)
    if nj not in _builds:
        _builds[nj] = _build(tmp_path_factory, "ssd_main.cpp", (f"-DSSD_NJ={nj}", f"-DSSD_ROWS={SSD_ROWS}"))
    return _builds[nj]


def _meta(lengths: list[int], slots: list[int], initial: list[bool]) -> AttentionMetadata:
    qsl = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=qsl[1:])
    n = int(qsl[-1])
    slots_a, initial_a = np.array(slots, np.int32), np.array(initial)
    return AttentionMetadata(
        qsl, np.array(lengths, np.int32), np.zeros((len(lengths), 1), np.int32), np.zeros(n, np.int32),
        np.zeros(n, np.int32), max(lengths), max(lengths), 16, host_query_start_loc=qsl,
        state_slots=slots_a, has_initial_state=initial_a, host_state_slots=slots_a, host_has_initial_state=initial_a,
    )  # fmt: skip


@pytest.mark.parametrize(("lengths", "slots", "initial", "heads", "head_dim", "groups", "d_state"), [
    # prefill chunks and a decode, G = 2; head_dim and d_state not multiples of a warp's rows / lanes
    ([6, 11, 1], [2, 0, 3], [True, False, True], 4, 6, 2, 40),
    # a decode batch: one token each, two of them starting from zeros, G = 1
    ([1, 1, 1, 1, 1], [4, 0, 3, 1, 2], [True, False, True, True, False], 2, 20, 1, 16),
    # one long sequence from zeros, a group per head, d_state 128 (Nemotron-H's and Granite 4's)
    ([23, 2], [1, 2], [False, True], 4, 16, 4, 128),
    # a negative state row skips its sequence (as causal_conv1d.cu does): its rows stay unwritten
    ([5, 3, 1], [2, -1, 1], [True, True, False], 2, 8, 1, 16),
])  # fmt: skip
def test_ssd_scan_emulated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
    lengths: list[int], slots: list[int], initial: list[bool], heads: int, head_dim: int, groups: int, d_state: int,
) -> None:  # fmt: skip
    rng, seed = fresh_rng(request.node.nodeid)
    n_tok, n_slots = sum(lengths), max(slots) + 2
    inner, gn = heads * head_dim, groups * d_state
    xbc_w, dt_w = inner + 2 * gn + 3, heads + 5  # wider rows than the parts read: strided rows
    xbc = rng.standard_normal((n_tok, xbc_w)).astype(np.float32)
    dt_raw = rng.normal(-1.0, 1.5, (n_tok, dt_w)).astype(np.float32)
    dt_raw[0, 0] = 25.0  # above softplus's threshold: the identity
    dt_bias = rng.normal(0, 0.5, heads).astype(np.float32)
    a = -np.exp(rng.uniform(-1, 1, heads)).astype(np.float32)
    d = rng.standard_normal(heads).astype(np.float32)
    state = rng.normal(0, 2, (n_slots, heads, head_dim, d_state)).astype(np.float32)
    for name, arr in (("xbc", xbc), ("dt", dt_raw), ("dt_bias", dt_bias), ("a", a), ("d", d), ("state", state)):
        arr.tofile(tmp_path / f"{name}.bin")
    meta = _meta(lengths, slots, initial)
    for name, arr in (("qsl", meta.host_query_start_loc), ("slots", meta.host_state_slots)):
        np.asarray(arr, np.int32).tofile(tmp_path / f"{name}.bin")
    meta.host_has_initial_state.astype(np.uint8).tofile(tmp_path / "init.bin")
    _run(_emulator(tmp_path_factory, d_state), "scan", tmp_path, n_tok, heads, head_dim, groups, d_state, xbc_w,
         dt_w, len(lengths), n_slots)  # fmt: skip

    kept = [i for i, slot in enumerate(slots) if slot >= 0]  # the reference runs the others alone
    qsl = meta.host_query_start_loc
    rows = np.concatenate([np.arange(qsl[i], qsl[i + 1]) for i in kept])
    n_kept = len(rows)
    x = xbc[rows, :inner].reshape(n_kept, heads, head_dim)
    b = xbc[rows, inner : inner + gn].reshape(n_kept, groups, d_state)
    c = xbc[rows, inner + gn : inner + 2 * gn].reshape(n_kept, groups, d_state)
    ref_state = state.copy()
    ref_meta = _meta([lengths[i] for i in kept], [slots[i] for i in kept], [initial[i] for i in kept])
    ref = CpuBackend().ssd_scan(x, dt_raw[rows, :heads], dt_bias, a, b, c, d, ref_state, ref_meta, 8)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, heads, head_dim)
    got_state = np.fromfile(tmp_path / "state_out.bin", np.float32).reshape(state.shape)
    assert np.isnan(np.delete(got, rows, axis=0)).all(), f"a skipped sequence's rows were written, seed={seed}"
    assert not np.isnan(got[rows]).any(), f"seed={seed}"
    assert rel_err(got[rows], ref) < 2e-5, f"seed={seed}"
    for slot in range(n_slots):
        if slot in slots:
            assert rel_err(got_state[slot], ref_state[slot]) < 2e-5, f"slot {slot}, seed={seed}"
        else:  # a row no sequence owns is left alone
            np.testing.assert_array_equal(got_state[slot], state[slot])


@pytest.mark.parametrize(("n_tok", "inner", "groups"), [(3, 48, 3), (2, 1024, 2), (1, 96, 1)])
def test_gated_group_rms_norm_emulated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
    n_tok: int, inner: int, groups: int,
) -> None:  # fmt: skip
    rng, seed = fresh_rng(request.node.nodeid)
    y_w, z_w = inner + 4, 2 * inner + 7  # z is a column range of the input projection's row
    y = rng.standard_normal((n_tok, y_w)).astype(np.float32)
    z = rng.normal(0, 2, (n_tok, z_w)).astype(np.float32)
    w = rng.standard_normal(inner).astype(np.float32)
    for name, arr in (("y", y), ("z", z), ("w", w)):
        arr.tofile(tmp_path / f"{name}.bin")
    eps = 1e-5
    _run(_emulator(tmp_path_factory, 16), "norm", tmp_path, n_tok, inner, groups, y_w, z_w, eps,
         norm_threads(inner // groups))  # fmt: skip
    ref = CpuBackend().gated_group_rms_norm(y[:, :inner], z[:, :inner], w, eps, groups)
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(n_tok, inner)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"
