"""attention_decode.cu (one query token per sequence) on the SIMT emulator, against the numpy
backend's attention (and for attn_dec_rope_*, its rope_and_cache then attention). Not marked `gpu`:
these run in CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err, rope_tables
from emulator import build, run

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.attention import group_bucket

pytestmark = pytest.mark.slow  # ~40 s together: kernels run thread by thread on the CPU

BLOCK = 16


@pytest.fixture(scope="module", params=[(), ("-DDEC_PREFETCH=1",), ("-DDEC_PVEC=0",)], ids=["pvec", "prefetch", "loop"])
def decode_emu(request, tmp_path_factory) -> Path:
    """The kernel as built by default (its value loop reading four keys' probabilities at a time, DEC_PVEC), with
    its next chunk prefetched into registers (DEC_PREFETCH), and with the plain value loop (DEC_PVEC=0)."""
    return build(tmp_path_factory, "attn_decode_main.cpp", request.param)


def _decode_case(rng, ctxs: list[int], heads: tuple[int, int, int]):
    """Paged caches in shuffled blocks holding each sequence's keys, and one query per sequence."""
    n_heads, n_kv, head_dim = heads
    per_seq = [max(1, -(-ctx // BLOCK)) for ctx in ctxs]
    order = rng.permutation(sum(per_seq) + 3)
    tables = np.zeros((len(ctxs), max(per_seq) + 2), np.int32)  # wider than needed, as a graph's are
    k_cache = np.zeros((len(order), BLOCK, n_kv, head_dim), np.float32)
    v_cache = np.zeros_like(k_cache)
    cpu, used = CpuBackend(), 0
    for i, ctx in enumerate(ctxs):
        tables[i, : per_seq[i]] = order[used : used + per_seq[i]]
        used += per_seq[i]
        slots = tables[i, np.arange(ctx) // BLOCK] * BLOCK + np.arange(ctx) % BLOCK
        k, v = (
            rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float16).astype(np.float32) for _ in range(2)
        )
        cpu.write_kv(k_cache, v_cache, k, v, slots)
    q = rng.standard_normal((len(ctxs), n_heads, head_dim)).astype(np.float32)
    return q, k_cache, v_cache, _decode_meta(np.array(ctxs, np.int32), tables)


def _decode_meta(seq_lens: np.ndarray, tables: np.ndarray) -> AttentionMetadata:
    """One query token per sequence, at position seq_len - 1."""
    qsl = np.arange(len(seq_lens) + 1, dtype=np.int32)
    return AttentionMetadata(qsl, seq_lens, tables, np.zeros(len(seq_lens), np.int32), seq_lens - 1, 1,
                             int(seq_lens.max()), BLOCK, qsl, seq_lens)  # fmt: skip


@pytest.mark.parametrize(("ctxs", "heads", "window", "cap", "blocks"), [
    ([1, 17, 300], (32, 8, 128), None, None, 8),  # 1 chunk, 1 chunk, 5 chunks over 5 blocks
    ([700, 5], (32, 8, 128), None, None, 3),  # 11 chunks looping over 3 blocks
    ([64, 65, 130], (16, 8, 128), None, None, 16),  # chunk edges; most blocks idle
    ([200, 90], (4, 1, 256), 100, None, 4),  # Gemma-like: head_dim 256, sliding window
    ([150, 33], (12, 4, 64), None, 5.0, 2),  # softcap, head_dim 64 (two threads per output dim)
    ([260, 1], (8, 1, 64), 40, None, 1),  # one block walks every chunk of a window
    ([129], (7, 1, 128), None, None, 4),  # a group of 7 in the 8-head variant
    ([300, 40], (16, 2, 256), None, None, 4),  # Qwen3.5-MoE's heads: group 8 of head_dim 256
])  # fmt: skip
def test_attention_decode_emulated(
    request: pytest.FixtureRequest, decode_emu: Path, tmp_path: Path, ctxs, heads, window, cap, blocks
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap)
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables)):
        a.tofile(tmp_path / f"{name}.bin")
    k_cache.astype(np.float16).tofile(tmp_path / "k.bin")
    v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
    run(decode_emu, tmp_path, head_dim, group_bucket(n_heads, n_kv), len(ctxs), n_heads, n_kv, BLOCK,
        meta.block_tables.shape[1], scale, cap or 0.0, window or 0, blocks)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize(("ctxs", "heads", "blocks"), [
    ([1, 17, 300], (32, 8, 128), 1),  # Qwen3-8B's group of 4, one block walking every chunk
    ([700, 5], (16, 2, 256), 3),  # head dim 256 (two dims a thread), group 8, the merge
])  # fmt: skip
def test_probabilities_four_keys_a_load_give_the_same_output(
    request: pytest.FixtureRequest, tmp_path_factory, tmp_path: Path, ctxs, heads, blocks
) -> None:
    """DEC_PVEC reads the value loop's probabilities four keys at a time; every sum takes its keys in the same
    order, so the output is the plain loop's bit for bit."""
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables)):
        a.tofile(tmp_path / f"{name}.bin")
    k_cache.astype(np.float16).tofile(tmp_path / "k.bin")
    v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
    outs = []
    for defines in (("-DDEC_PVEC=0",), ()):
        run(build(tmp_path_factory, "attn_decode_main.cpp", defines), tmp_path, head_dim, group_bucket(n_heads, n_kv),
            len(ctxs), n_heads, n_kv, BLOCK, meta.block_tables.shape[1], head_dim**-0.5, 0.0, 0, blocks)  # fmt: skip
        outs.append(np.fromfile(tmp_path / "out.bin", np.float32))
    assert np.isfinite(outs[0]).all(), f"seed={seed}"
    np.testing.assert_array_equal(outs[1], outs[0], err_msg=f"seed={seed}")


@pytest.fixture(scope="module")
def half_out_emu(tmp_path_factory) -> Path:
    """The kernel writing float16 output (DEC_OUT_HALF: for an output projection that reads float16)."""
    return build(tmp_path_factory, "attn_decode_main.cpp", ("-DDEC_OUT_HALF=1",))


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize(("ctxs", "blocks"), [([1, 17, 300], 1), ([700, 5, 130], 3)])  # one block; the merge
def test_float16_output_is_the_float32_output_rounded(
    request: pytest.FixtureRequest, decode_emu: Path, half_out_emu: Path, tmp_path: Path, ctxs, blocks, rope: bool
) -> None:
    """DEC_OUT_HALF's output is exactly the float32 build's, each element rounded to nearest (what the cast
    before the output projection gives), over both output paths (one active block, the blocks' merge)."""
    rng, seed = fresh_rng(request.node.nodeid)
    heads = (32, 8, 128)
    q, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    pos = meta.seq_lens - 1
    slots = (meta.block_tables[np.arange(len(ctxs)), pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
    table = CpuBackend().rope_table(*rope_tables(head_dim, 1024))
    qkv = rng.standard_normal((len(ctxs), (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables), ("qkv", qkv),
                    ("pos", pos), ("slots", slots), ("cos", table.cos), ("sin", table.sin)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    args = (tmp_path, head_dim, group_bucket(n_heads, n_kv), len(ctxs), n_heads, n_kv, BLOCK,
            meta.block_tables.shape[1], head_dim**-0.5, 0.0, 0, blocks)  # fmt: skip
    rope_args = ("rope", *args, 1e-6, 1024, 0, 0) if rope else args
    outs = []
    for exe, dtype in ((decode_emu, np.float32), (half_out_emu, np.float16)):
        k_cache.astype(np.float16).tofile(tmp_path / "k.bin")  # the rope build writes the new keys back
        v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
        run(exe, *rope_args)
        outs.append(np.fromfile(tmp_path / "out.bin", dtype))
    full, half = outs
    assert np.isfinite(full).all() and np.abs(full).max() > 0.1, f"seed={seed}"
    np.testing.assert_array_equal(half, full.astype(np.float16), err_msg=f"seed={seed}")


@pytest.mark.parametrize(("ctxs", "heads", "window", "blocks"), [
    ([1, 17, 300], (64, 8, 64), None, 8),  # GPT-OSS's heads: 64 x 64 over 8 KV heads; one block, several
    ([700, 5], (64, 8, 64), 128, 3),  # its sliding layers (window 128), blocks looping over chunks
    ([129, 64], (32, 8, 128), None, 1),  # one block: the n_act == 1 output path
])  # fmt: skip
def test_attention_decode_sinks_emulated(
    request: pytest.FixtureRequest, decode_emu: Path, tmp_path: Path, ctxs, heads, window, blocks
) -> None:
    """GPT-OSS's attention sinks: one more logit per head in the softmax's denominator, against numpy,
    over every output path (one block, a cluster or the global merge). Some sinks sit far above the
    scores, where a head's output all but vanishes."""
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    sinks = rng.normal(0.0, 2.0, n_heads).astype(np.float32)
    sinks[::7] += 12.0
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, None, sinks=sinks)
    plain = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, None)
    assert rel_err(plain, ref) > 0.05  # the sinks change the answer: the check below can fail
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables), ("sinks", sinks)):
        a.tofile(tmp_path / f"{name}.bin")
    k_cache.astype(np.float16).tofile(tmp_path / "k.bin")
    v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
    run(decode_emu, tmp_path, head_dim, group_bucket(n_heads, n_kv), len(ctxs), n_heads, n_kv, BLOCK,
        meta.block_tables.shape[1], scale, 0.0, window or 0, blocks)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


# (ctxs, (n_heads, n_kv, head_dim), window, softcap, blocks, interleaved, QK-norm, padding rows, rotary
# dims: None for the whole head, fewer for partial RoPE). A padding row has slot -1 (nothing stored, any
# finite output); one of context 0 is a graph bucket's.
ROPE_CASES = [
    ([1, 17, 300], (32, 8, 128), None, None, 8, False, True, (), None),  # Qwen3-8B: group 4, 1 and 5 chunks
    ([700, 5, 0], (32, 4, 128), None, None, 3, True, True, (2,), None),  # group 8: the new key in a looped chunk
    ([64, 65, 130], (8, 8, 128), None, None, 16, False, False, (), None),  # group 1, chunk edges, no QK-norm
    ([200, 90], (16, 4, 64), 100, None, 4, True, False, (), None),  # head_dim 64, sliding window
    ([150, 33, 77], (16, 2, 64), None, 5.0, 2, False, True, (2,), None),  # group 8, softcap, padding mid-context
    ([260, 1], (8, 1, 64), 40, None, 1, True, True, (), None),  # one block walks every chunk of a window
    ([129], (7, 1, 128), None, None, 4, False, True, (), None),  # a group of 7 in the 8-head variant
    ([200, 33], (4, 1, 256), 100, None, 4, False, True, (), None),  # Gemma-like head_dim 256
    ([200, 33], (4, 1, 256), None, None, 4, False, True, (), 64),  # Qwen3.5: 64 of 256 dims turn (NeoX)
    ([130, 1, 0], (24, 4, 256), None, None, 4, False, True, (2,), 64),  # Qwen3.5-27B: group 6 of the 8-head variant
    ([90, 1], (8, 2, 128), None, None, 2, True, True, (1,), 32),  # partial, interleaved pairs, padding
]  # fmt: skip


@pytest.mark.parametrize(
    ("ctxs", "heads", "window", "cap", "blocks", "interleaved", "norm", "padding", "rotary"), ROPE_CASES
)
def test_attention_decode_rope_emulated(
    request: pytest.FixtureRequest,
    decode_emu: Path, tmp_path: Path, ctxs, heads, window, cap, blocks, interleaved, norm, padding, rotary
) -> None:
    """attn_dec_rope_* (rope_cache's work fused in) equals the numpy rope_and_cache then attention:
    the output of every real token, the new k and v in the caches at their slots and nothing else
    written. The new slots start as NaN: the kernel must never read them from the cache."""
    rng, seed = fresh_rng(request.node.nodeid)
    cpu = CpuBackend()
    _, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    seq_lens, tables = meta.seq_lens, meta.block_tables
    pos = np.maximum(seq_lens - 1, 0)
    slots = (tables[np.arange(len(ctxs)), pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
    slots[list(padding)] = -1
    kept = slots >= 0
    new = slots[kept]
    k_cache.reshape(-1, n_kv, head_dim)[new] = np.nan  # the new token's entry is not written yet
    v_cache.reshape(-1, n_kv, head_dim)[new] = np.nan
    max_pos = 1024
    table = cpu.rope_table(*rope_tables(rotary or head_dim, max_pos))  # rotary < head_dim: partial RoPE
    qkv = rng.standard_normal((len(ctxs), (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    qn, kn = (rng.standard_normal(head_dim).astype(np.float32) for _ in range(2))
    for name, a in (("qkv", qkv), ("seq_lens", seq_lens), ("tables", tables), ("pos", pos), ("slots", slots),
                    ("cos", table.cos), ("sin", table.sin), ("qn", qn), ("kn", kn)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    k_in, v_in = k_cache.astype(np.float16), v_cache.astype(np.float16)
    k_in.tofile(tmp_path / "k.bin")
    v_in.tofile(tmp_path / "v.bin")
    scale, eps = head_dim**-0.5, 1e-6
    run(decode_emu, "rope", tmp_path, head_dim, group_bucket(n_heads, n_kv), len(ctxs), n_heads, n_kv, BLOCK,
        tables.shape[1], scale, cap or 0.0, window or 0, blocks, eps, max_pos, int(interleaved), int(norm))  # fmt: skip

    # The reference: rope_cache's numpy twin, its caches rounded to float16 as the GPU's hold them.
    q = cpu.rope_and_cache(qkv[kept], n_heads, n_kv, head_dim, qn if norm else None, kn if norm else None, eps,
                           pos[kept], table, interleaved, k_cache, v_cache, new)  # fmt: skip
    k_ref, v_ref = k_cache.astype(np.float16), v_cache.astype(np.float16)
    k_got = np.fromfile(tmp_path / "k_out.bin", np.float16).reshape(k_in.shape)
    v_got = np.fromfile(tmp_path / "v_out.bin", np.float16).reshape(v_in.shape)
    # Attention over the caches the kernel wrote: its new key may sit one float16 step from the
    # reference's (checked below), which alone moves the output by ~1e-5.
    ref = cpu.attention(q, k_got.astype(np.float32), v_got.astype(np.float32), _decode_meta(seq_lens[kept],
                        tables[kept]), scale, window, cap)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(len(ctxs), n_heads, head_dim)
    assert np.isfinite(got).all(), f"seed={seed}"
    assert rel_err(got[kept], ref) < 1e-5, f"seed={seed}"
    rows = k_in.reshape(-1, n_kv, head_dim).shape[0]
    np.testing.assert_allclose(
        k_got.reshape(rows, -1)[new], k_ref.reshape(rows, -1)[new], rtol=1e-3, atol=1e-3
    )
    np.testing.assert_array_equal(v_got.reshape(rows, -1)[new], v_ref.reshape(rows, -1)[new])
    others = np.setdiff1d(np.arange(rows), new)  # padding tokens' slots included: untouched
    np.testing.assert_array_equal(k_got.reshape(rows, -1)[others], k_in.reshape(rows, -1)[others])
    np.testing.assert_array_equal(v_got.reshape(rows, -1)[others], v_in.reshape(rows, -1)[others])
