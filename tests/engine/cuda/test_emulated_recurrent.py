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
from cuda_samples import fresh_rng, rel_err, varlen_meta
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.recurrent_reference import causal_conv1d, gated_delta_net_rule, gated_rms_norm
from app.engine.specs import GatedDeltaNetSpec

pytestmark = pytest.mark.slow  # kernels run thread by thread on the CPU

NUM_SLOTS = 6
HEAD_K_DIM = 32  # the delta harness's GDN_DK (a second build has the released models' 128)
# The delta rule: float32 products of up to head_k_dim terms per token, compounded through the state
# over a sequence; the reference takes its chunked (UT-transform, linear-solve) form past 8 tokens,
# which rounds differently from the token-by-token kernel. Measured differences stay below 1e-6; 2e-5
# leaves an order of magnitude of margin and still catches any wrong index, gate or ordering (those
# give errors of order 1).
DELTA_TOL = 2e-5


@pytest.fixture(scope="module")
def recurrent_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "recurrent_main.cpp", (f"-DGDN_DK={HEAD_K_DIM}",))


@pytest.fixture(scope="module", params=[128, 256])
def recurrent_emu_wide(request, tmp_path_factory) -> tuple[Path, int]:
    """A build for the released models' head_k_dim (128), and for 256 (two q/k elements a thread, chunks of 8)."""
    return _build(tmp_path_factory, "recurrent_main.cpp", (f"-DGDN_DK={request.param}",)), request.param


def write_meta(folder: Path, meta: AttentionMetadata) -> None:
    meta.host_query_start_loc.tofile(folder / "qsl.bin")
    meta.host_state_slots.tofile(folder / "slots.bin")
    meta.host_has_initial_state.astype(np.uint8).tofile(folder / "init.bin")


@pytest.mark.parametrize(("lengths", "initial", "k", "bias", "silu", "chunk"), [
    ([7, 1, 19, 3], [True, False, False, True], 4, False, True, 64),  # Gated DeltaNet's conv, one chunk
    ([7, 1, 19, 3], [True, False, False, True], 4, False, True, 5),  # ... in chunks of 5 tokens a block
    ([2, 33], [False, True], 4, True, True, 8),  # Mamba-2's (a bias)
    ([5, 1, 1, 2], [True, True, False, True], 3, True, False, 3),  # shorter than K-1: the older inputs stay
    ([1, 1, 1, 1], [True, False, True, True], 4, False, True, 4),  # a decode-shaped batch through varlen
])  # fmt: skip
def test_causal_conv1d_varlen_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, lengths, initial, k, bias, silu, chunk
) -> None:
    """Each sequence's rows continue its own state row (or zeros) and leave its last K-1 inputs there;
    rows of other slots are untouched. Blocks of `chunk` tokens after a sequence's first read their
    window from x, and only the first writes the state."""
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
    _run(recurrent_emu, "conv", tmp_path, len(x), len(lengths), channels, k, int(silu), 0, 64, chunk)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "state.bin", np.float32).reshape(state.shape), ref_state)


def test_causal_conv1d_decode_emulated(request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path) -> None:
    """The decode entry (row i is sequence i's token, no query_start_loc read) matches the reference's
    batched step; a negative slot (a padding row of a captured batch) gets zeros and touches no state."""
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
    _run(recurrent_emu, "conv", tmp_path, 4, 4, channels, k, 1, 1, 32, 1)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    real = [0, 2, 3]
    assert rel_err(got[real], ref[real]) < 1e-6, f"seed={seed}"
    np.testing.assert_array_equal(got[1], 0.0)  # the padding row: finite zeros for the layers after it
    got_state = np.fromfile(tmp_path / "state.bin", np.float32).reshape(state.shape)
    np.testing.assert_array_equal(got_state[[4, 2, 5]], ref_state[[4, 2, 5]])
    np.testing.assert_array_equal(got_state[[0, 1, 3]], state[[0, 1, 3]])  # slot 0 was the padding row's


@pytest.mark.parametrize("chunked", [False, True], ids=["tokens", "chunks"])
@pytest.mark.parametrize(("lengths", "initial", "heads", "dv", "tiled"), [
    ([5, 12, 1, 9], [True, False, True, False], (2, 2), 32, False),  # prefill: recurrent and chunked reference
    ([3, 37], [True, True], (1, 4), 40, False),  # GQA: 4 value heads per k head; Dv past one block of 32
    ([11, 2, 1], [False, True, True], (2, 6), 16, True),  # llama.cpp's tiled value-head order
    ([1, 1, 1, 1, 1], [True, False, True, True, True], (2, 4), 32, False),  # decode through the varlen entry
])  # fmt: skip
def test_gated_delta_varlen_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, lengths, initial, heads, dv, tiled, chunked
) -> None:
    """Token by token (gated_delta_varlen) and in chunks of 16 (gated_delta_chunked: sequences of one, of
    part of a chunk and of several chunks)."""
    rng, seed = fresh_rng(request.node.nodeid)
    hk, hv = heads
    spec = GatedDeltaNetSpec(hk, hv, HEAD_K_DIM, dv, 4, tiled)
    meta = varlen_meta(lengths, list(rng.permutation(NUM_SLOTS)[: len(lengths)].astype(int)), initial)
    got, got_state, ref, ref_state = _delta_case(rng, recurrent_emu, tmp_path, spec, meta, mode=2 if chunked else 0)
    assert rel_err(got, ref) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got_state, ref_state) < DELTA_TOL, f"seed={seed}"
    untouched = sorted(set(range(NUM_SLOTS)) - set(meta.host_state_slots.tolist()))
    np.testing.assert_array_equal(got_state[untouched], ref_state[untouched])


def test_gated_delta_released_head_size_emulated(
    request: pytest.FixtureRequest, recurrent_emu_wide: tuple[Path, int], tmp_path: Path
) -> None:
    """Qwen3-Next / Qwen3.5's 128 x 128 heads (32 state rows per thread, four column blocks), and 256-dim
    keys, GQA 1:2, token by token and chunked (a sequence of more than one chunk)."""
    rng, seed = fresh_rng(request.node.nodeid)
    exe, dk = recurrent_emu_wide
    spec = GatedDeltaNetSpec(1, 2, dk, 128, 4, False)
    meta = varlen_meta([19, 1], [2, 4], [True, False])
    got, got_state, ref, ref_state = _delta_case(rng, exe, tmp_path, spec, meta, mode=0)
    assert rel_err(got, ref) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got_state, ref_state) < DELTA_TOL, f"seed={seed}"
    got, got_state, ref, ref_state = _delta_case(rng, exe, tmp_path, spec, meta, mode=2)
    assert rel_err(got, ref) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got_state, ref_state) < DELTA_TOL, f"seed={seed}"


@pytest.mark.parametrize("mode", [1, 0, 2], ids=["decode", "tokens", "chunks"])
def test_gated_delta_decode_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, mode: int
) -> None:
    """The decode entry (row i is sequence i's token; sequences that start here ignore their row's old
    state), and a padding row (slot -1, as a captured batch pads its bucket) in every kernel: zeros out,
    its state row untouched."""
    rng, seed = fresh_rng(request.node.nodeid)
    spec = GatedDeltaNetSpec(2, 4, HEAD_K_DIM, 32, 4, False)
    meta = varlen_meta([1] * 4, [5, 1, 3, 0], [True, False, True, True])
    got, got_state, ref, ref_state = _delta_case(rng, recurrent_emu, tmp_path, spec, meta, mode, padding=3)
    real = [0, 1, 2]
    assert rel_err(got[real], ref[real]) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got_state[[5, 1, 3]], ref_state[[5, 1, 3]]) < DELTA_TOL, f"seed={seed}"
    np.testing.assert_array_equal(got[3], 0.0)
    untouched = np.fromfile(tmp_path / "state_in.bin", np.float32).reshape(got_state.shape)
    np.testing.assert_array_equal(got_state[[0, 2, 4]], untouched[[0, 2, 4]])


def _delta_case(
    rng, exe: Path, folder: Path, spec: GatedDeltaNetSpec, meta: AttentionMetadata, mode: int,
    padding: int | None = None,
):
    """Random inputs in the layer's ranges through the kernel (`mode`: 0 token by token, 1 decode, 2 chunked)
    and the reference: (out, state) of each. Sequence `padding` has slot -1 for the kernel (the reference
    runs it in its slot)."""
    n = int(meta.host_query_start_loc[-1])
    hv = spec.num_v_heads
    mixed = rng.standard_normal((n, spec.conv_dim)).astype(np.float32)
    ba = (rng.standard_normal((n, 2 * hv)) * 2).astype(np.float32)
    neg_a = -np.exp(rng.uniform(-2, 1, hv)).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state = (rng.standard_normal((NUM_SLOTS, *spec.state_shapes()[1])) * 0.3).astype(np.float32)
    for name, a in (("mixed", mixed), ("ba", ba), ("nega", neg_a), ("dtb", dt_bias), ("state", state)):
        a.tofile(folder / f"{name}.bin")
    state.tofile(folder / "state_in.bin")
    write_meta(folder, meta)
    if padding is not None:
        slots = meta.host_state_slots.copy()
        slots[padding] = -1
        slots.tofile(folder / "slots.bin")
    ref_state = state.copy()
    ref = gated_delta_net_rule(np, mixed, ba, neg_a, dt_bias, ref_state, meta, spec)
    _run(exe, "delta", folder, n, meta.num_seqs, spec.num_k_heads, hv, spec.head_v_dim, int(spec.tiled_v_heads),
         mode)  # fmt: skip
    got = np.fromfile(folder / "o.bin", np.float32).reshape(ref.shape)
    return got, np.fromfile(folder / "state.bin", np.float32).reshape(state.shape), ref, ref_state


@pytest.mark.parametrize(("dim", "threads"), [(128, 32), (40, 64)])
def test_gated_rms_norm_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, dim: int, threads: int
) -> None:
    """RMSNorm per value head times silu(z), z read from a wider row (the in-projection's z columns)."""
    rng, seed = fresh_rng(request.node.nodeid)
    n, heads, eps = 3, 4, 1e-6
    x = rng.standard_normal((n, heads, dim)).astype(np.float32)
    z_rows = rng.standard_normal((n, heads * dim + 7)).astype(np.float32)  # 7 more columns: a row stride
    w = rng.standard_normal(dim).astype(np.float32)
    for name, a in (("x", x), ("z", z_rows), ("w", w)):
        a.tofile(tmp_path / f"{name}.bin")
    _run(recurrent_emu, "gated_norm", tmp_path, n, heads, dim, z_rows.shape[1], eps, threads)
    ref = gated_rms_norm(np, x, z_rows[:, : heads * dim], w, eps)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"


@pytest.mark.parametrize(("dv", "tiled", "n_v"), [(128, False, 4), (40, True, 4), (32, False, 6), (64, True, 2)])
def test_gated_delta_decode_fused_emulated(
    request: pytest.FixtureRequest, recurrent_emu: Path, tmp_path: Path, dv: int, tiled: bool, n_v: int
) -> None:
    """A decode step with the short conv before it and the gated RMSNorm after it fused in: the raw output,
    the normalized one (the last of a head's dv / 32 blocks normalizes it), the recurrent state and the conv
    state (v columns shifted by their block, q/k by the last block of their key head) as the references'
    conv, rule and norm in turn; a padding row's zeros and untouched states; a sequence starting here; the
    counters back at zero after two launches."""
    _fused_case(request, recurrent_emu, tmp_path, GatedDeltaNetSpec(2, n_v, HEAD_K_DIM, dv, 4, tiled))


def test_gated_delta_decode_fused_released_head_size_emulated(
    request: pytest.FixtureRequest, recurrent_emu_wide: tuple[Path, int], tmp_path: Path
) -> None:
    """The fused decode step at head_k_dim 128 (Qwen3.5, Qwen3-Next) and 256 (two q/k inputs a thread)."""
    exe, dk = recurrent_emu_wide
    _fused_case(request, exe, tmp_path, GatedDeltaNetSpec(2, 4, dk, 128, 4, False))


def _fused_case(request: pytest.FixtureRequest, exe: Path, tmp_path: Path, spec: GatedDeltaNetSpec) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    dv, tiled = spec.head_v_dim, spec.tiled_v_heads
    meta = varlen_meta([1] * 4, [5, 1, 3, 0], [True, False, True, True])
    hv, eps, channels = spec.num_v_heads, 1e-6, spec.conv_dim
    qkv = rng.standard_normal((4, channels)).astype(np.float32)
    conv_w = (rng.standard_normal((channels, 4)) * 0.5).astype(np.float32)
    conv_state = rng.standard_normal((NUM_SLOTS, *spec.state_shapes()[0])).astype(np.float32)
    ba = (rng.standard_normal((4, 2 * hv)) * 2).astype(np.float32)
    neg_a = -np.exp(rng.uniform(-2, 1, hv)).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state = (rng.standard_normal((NUM_SLOTS, *spec.state_shapes()[1])) * 0.3).astype(np.float32)
    z_rows = rng.standard_normal((4, hv * dv + 5)).astype(np.float32)  # a wider row: the projection's stride
    norm_w = rng.standard_normal(dv).astype(np.float32)
    for name, a in (("mixed", qkv), ("convw", conv_w), ("convstate", conv_state), ("ba", ba), ("nega", neg_a),
                    ("dtb", dt_bias), ("state", state), ("z", z_rows), ("normw", norm_w)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    write_meta(tmp_path, meta)
    slots = meta.host_state_slots.copy()
    slots[3] = -1  # a graph bucket's padding row
    slots.tofile(tmp_path / "slots.bin")
    ref_conv, ref_state = conv_state.copy(), state.copy()
    mixed = causal_conv1d(np, qkv, conv_w, None, ref_conv, meta, True)
    core = gated_delta_net_rule(np, mixed, ba, neg_a, dt_bias, ref_state, meta, spec)
    ref = gated_rms_norm(np, core, z_rows[:, : hv * dv], norm_w, eps)
    _run(exe, "delta_fused", tmp_path, 4, spec.num_k_heads, hv, dv, int(tiled), z_rows.shape[1], eps, 4, 2)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(ref.shape)
    raw = np.fromfile(tmp_path / "o.bin", np.float32).reshape(ref.shape)
    got_state = np.fromfile(tmp_path / "state.bin", np.float32).reshape(state.shape)
    got_conv = np.fromfile(tmp_path / "convstate.bin", np.float32).reshape(conv_state.shape)
    real, used = [0, 1, 2], [5, 1, 3]
    assert rel_err(raw[real], core[real]) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got[real], ref[real]) < DELTA_TOL, f"seed={seed}"
    assert rel_err(got_state[used], ref_state[used]) < DELTA_TOL, f"seed={seed}"
    np.testing.assert_array_equal(got_conv[used], ref_conv[used])
    np.testing.assert_array_equal(got[3], 0.0)
    untouched = [0, 2, 4]  # slot 0 is the padding row's in the reference only
    np.testing.assert_array_equal(got_conv[untouched], conv_state[untouched])
    np.testing.assert_array_equal(got_state[untouched], state[untouched])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "counters.bin", np.int32), 0)
