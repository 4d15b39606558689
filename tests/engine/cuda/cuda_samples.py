"""Random checkpoint tensors in every GGUF format, and the oracle that decodes them.

Shared by the GPU tests and bench/suite/gpu_check.py. Block bytes are random; only the float16
scale fields are set to finite values of a realistic size, so every code path of a
decoder (all nibbles, all high bits, signed scales) is exercised without inf or NaN.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.backend.fp8_kv import Fp8KvCache
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES, QuantType

ALL_QTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "NVFP4",
              "IQ4_NL", "IQ4_XS")

# Byte offsets of the float16 fields inside one block: (scale offsets, offsets of mins/dmin).
_F16_FIELDS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "Q4_0": ((0,), ()),
    "Q4_1": ((0,), (2,)),
    "Q5_0": ((0,), ()),
    "Q5_1": ((0,), (2,)),
    "Q8_0": ((0,), ()),
    "Q4_K": ((0,), (2,)),
    "Q5_K": ((0,), (2,)),
    "Q6_K": ((208,), ()),
    "IQ4_NL": ((0,), ()),
    "IQ4_XS": ((0,), ()),  # its 6-bit sub-block scales stay random
    "MXFP4": ((), ()),  # an e8m0 exponent byte instead (below)
    "NVFP4": ((), ()),  # four ue4m3 scale bytes instead (below)
}


def fresh_rng(node_id: str) -> tuple[np.random.Generator, int]:
    """A generator and its seed (printed on failure). The seed is fixed per test, derived from its
    pytest node id, so runs repeat; `PADDOCK_TEST_SEED` set to a number replays that seed and set
    to `random` draws one from the OS to explore new inputs."""
    seed = _seed_for(node_id, os.environ.get("PADDOCK_TEST_SEED", "").strip())
    return np.random.default_rng(seed), seed


def _seed_for(node_id: str, choice: str) -> int:
    if not choice:
        return zlib.crc32(node_id.encode())
    if choice == "random":
        return int.from_bytes(os.urandom(4), "little")
    try:
        return int(choice)
    except ValueError:
        raise ValueError(f"PADDOCK_TEST_SEED must be a number or 'random', not {choice!r}") from None


def random_tensor(
    qtype_name: str, rows: int, cols: int, rng: np.random.Generator, name: str = "w"
) -> QuantizedTensor:
    qtype = QUANT_TYPES[qtype_name]
    if qtype.is_float:
        values = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.05)
        return _float_tensor(name, qtype, values)
    n_blocks = cols // qtype.block_size
    raw = rng.integers(0, 256, (rows, n_blocks, qtype.type_size), dtype=np.uint8)
    scales, mins = _F16_FIELDS[qtype_name]
    for off in scales:
        d = rng.uniform(0.002, 0.02, (rows, n_blocks)).astype(np.float16)
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(rows, n_blocks, 2)
    for off in mins:
        m = (rng.uniform(0.002, 0.02, (rows, n_blocks)) * rng.choice([-1.0, 1.0], (rows, n_blocks))).astype(
            np.float16
        )
        raw[:, :, off : off + 2] = m.view(np.uint8).reshape(rows, n_blocks, 2)
    if qtype_name == "MXFP4":  # 2^(e - 128) * |q| <= 12: weights up to about 0.05
        raw[:, :, 0] = rng.integers(116, 123, (rows, n_blocks), dtype=np.uint8)
    if qtype_name == "NVFP4":  # ue4m3 scales 2^-6 .. 2^-3 (times |q| / 2 <= 6)
        raw[:, :, 0:4] = rng.integers(0x08, 0x20, (rows, n_blocks, 4), dtype=np.uint8)
    return QuantizedTensor(name, qtype, (rows, cols), raw.reshape(rows, n_blocks * qtype.type_size))


def _float_tensor(name: str, qtype: QuantType, values: np.ndarray) -> QuantizedTensor:
    rows, cols = values.shape
    if qtype.name == "F32":
        raw = values.view(np.uint8)
    elif qtype.name == "F16":
        raw = values.astype(np.float16).view(np.uint8)
    else:  # BF16: the upper 16 bits of float32 (truncation is as valid a bf16 value as rounding)
        raw = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return QuantizedTensor(name, qtype, (rows, cols), np.ascontiguousarray(raw).reshape(rows, -1))


def oracle_name() -> str:
    try:
        import app.engine.quant.reference  # noqa: F401
    except ImportError:
        return "gguf.quants.dequantize"
    return "app.engine.quant.reference.dequantize"


def dequantize_oracle(tensor: QuantizedTensor) -> np.ndarray:
    """float32 `[rows, cols]` from the project's numpy dequantizers (gguf-py's if those are absent)."""
    rows = tensor.data.shape[0]
    try:
        from app.engine.quant.reference import dequantize
    except ImportError:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize

        values = gguf_dequantize(tensor.data, GGMLQuantizationType(tensor.qtype.ggml_id))
    else:
        values = dequantize(tensor.data, tensor.qtype)
    return np.asarray(values, dtype=np.float32).reshape(rows, -1)


def expert_grouping(counts: list[int], k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`order` and `offsets` (int32) as moe_scatter and moe_offsets leave them for random pairs of which
    `counts[e]` go to group e: the pairs grouped by expert, in a random order within each group (the
    scatter's atomics give any order), pair p being token p // k's slot p % k."""
    if sum(counts) % k:
        raise ValueError(f"{sum(counts)} pairs are not whole tokens of {k}")
    group = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    order = np.concatenate([rng.permutation(np.flatnonzero(group == e)) for e in range(len(counts))])
    return order.astype(np.int32), np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def pair_groups(order, offsets, k: int):
    """kernels/moe.py's PairGroups on the device for an `order` / `offsets` (expert_grouping's): the
    slots with pairs listed ascending in `active`, each pair's place in `where`."""
    import cupy as cp

    from app.engine.kernels.moe import PairGroups

    # host or device arrays (cupy's refuse an implicit np.asarray)
    order, offsets = (np.asarray(a.get() if hasattr(a, "get") else a, np.int32) for a in (order, offsets))
    n_slots = offsets.size - 1
    busy = np.flatnonzero(np.diff(offsets) > 0)
    active = np.full(1 + n_slots, -1, np.int32)
    active[0], active[1 : 1 + busy.size] = busy.size, busy
    where = np.empty_like(order)
    where[order] = np.arange(order.size, dtype=np.int32)
    return PairGroups(cp.asarray(offsets), cp.asarray(order), cp.asarray(where), cp.asarray(active), n_slots,
                      int(order.size), k, False)  # fmt: skip


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ in float64."""
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got64 - ref64) / max(np.linalg.norm(ref64), 1e-30))


GEMV_TOL = 2e-5  # float32 x: only the order of accumulation differs from float64
INT_X_TOL = 3e-4  # int16 x (gemv_int.py): x rounded per 16 columns; inputs with outliers need the margin
GATED_FACTOR = 2  # act(gate . x) * (up . x) carries both products' errors (silu's slope adds ~7% at 4)
F16_TOL = 3e-3  # above 8 tokens: x and W rounded to float16 for the tensor cores (2^-11 each)


def rope_tables(head_dim: int, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin `[max_pos, head_dim // 2]` float32 of RoPE with base 10000 (a RopeTable's arrays)."""
    inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2) / head_dim))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def linear_tol(
    n_tok: int, n_cols: int, qtypes: list[str] | tuple[str, ...], nbytes: int, dense: bool = False
) -> float:
    """The relative-error bound of a `linear` product of `n_tok` rows over `nbytes` of weights: the
    path it takes decides it. 2..64 tokens go through tensor cores on the quantized weights
    (gemv_mma), more to cuBLAS on float16 (`dense`: the weight has a float16 copy): x and W in
    float16 either way."""
    from app.engine.kernels import gemv_mma

    if n_tok > 8 or gemv_mma.serves(n_tok, qtypes, n_cols) or (dense and n_tok >= 3):
        return F16_TOL
    return gemv_tol(n_tok, n_cols, qtypes, nbytes)


def experts_tol(n_tok: int, k: int, n_experts: int, qtype: str, n_cols: int, int_x: bool = False) -> float:
    """The relative-error bound of a MoE layer's experts (kernels/moe.py) on `n_tok` tokens: float32
    inputs on moe_grouped (GEMV_TOL), or on the tensor cores with many pairs an expert (moe_mma.py), where
    the gate/up and down products each round x and W to float16 and the gated unit carries both. `int_x`: the
    grouped products read int16 x past the few-tokens path's tokens (moe_forward's `int_x`; the CUDA backend's
    layers pass KernelOptions.moe_int_x, on by default: `backend_int_x()`)."""
    from app.engine.kernels import moe, moe_mma

    if moe_mma.serves(qtype, n_tok, k, n_experts, n_cols):
        return GATED_FACTOR * F16_TOL
    if int_x and n_tok > moe.FUSED_DECODE_MAX_TOKENS and moe.takes_int_x(qtype):
        return GATED_FACTOR * INT_X_TOL
    return GEMV_TOL


def backend_int_x() -> bool:
    """Whether the CUDA backend's MoE layers run the grouped products over int16 x (its KernelOptions' default)."""
    from app.engine.kernels.options import KernelOptions

    return KernelOptions().moe_int_x


def gemv_tol(n_tok: int, n_cols: int, qtypes: list[str] | tuple[str, ...], nbytes: int) -> float:
    """The bound of gemv.py's kernels themselves (float32 x, or int16 x for one token)."""
    from app.engine.kernels import gemv_int

    return INT_X_TOL if gemv_int.serves(n_tok, n_cols, qtypes, nbytes) else GEMV_TOL


def term_err(got: np.ndarray, ref: np.ndarray, w: np.ndarray, x: np.ndarray) -> float:
    """‖got − ref‖ against ‖|x|·|W|ᵀ‖, the size of the terms: rounding errors (float32 sums, x's
    int16 codes) scale with the terms, not with a sum that may cancel to near zero."""
    terms = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64)).T
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(terms))


def _act64(g: np.ndarray, kind: str) -> np.ndarray:
    if kind == "silu":
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))


def gated_term_err(got: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, x: np.ndarray, kind: str) -> float:
    """‖got − act(Wg x)·(Wu x)‖ against the size of the error that rounding x can make there:
    |∂/∂g|·(|Wg|·|x|) + |∂/∂u|·(|Wu|·|x|), to first order. With a dozen rows, a plain relative
    error is decided by whichever output happens to cancel (random k-quant blocks reach 15,000x)."""
    x64, wg, wu = (np.asarray(a, np.float64) for a in (x, w_gate, w_up))
    g, u = x64 @ wg.T, x64 @ wu.T
    slope = (_act64(g + 1e-6, kind) - _act64(g - 1e-6, kind)) / 2e-6
    scale = np.abs(slope * u) * (np.abs(x64) @ np.abs(wg).T) + np.abs(_act64(g, kind)) * (
        np.abs(x64) @ np.abs(wu).T
    )
    return float(np.linalg.norm(np.asarray(got, np.float64) - _act64(g, kind) * u) / np.linalg.norm(scale))


BLOCK = 16


def attention_case(rng, seqs, heads, q_scale=1.0):
    """Paged float16-valued caches for `seqs` [(new tokens, context)] in shuffled blocks, q for the new
    tokens and the metadata of that batch (host copies included): the attention tests' inputs."""
    n_heads, n_kv, head_dim = heads
    per_seq = [-(-ctx // BLOCK) for _, ctx in seqs]
    order = rng.permutation(sum(per_seq) + 3)
    tables = np.zeros((len(seqs), max(per_seq)), np.int32)
    k_cache = np.zeros((len(order), BLOCK, n_kv, head_dim), np.float32)
    v_cache = np.zeros_like(k_cache)
    cpu, used = CpuBackend(), 0
    for i, (_, ctx) in enumerate(seqs):
        tables[i, : per_seq[i]] = order[used : used + per_seq[i]]
        used += per_seq[i]
        slots = tables[i, np.arange(ctx) // BLOCK] * BLOCK + np.arange(ctx) % BLOCK
        k, v = (
            rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float16).astype(np.float32) for _ in range(2)
        )
        cpu.write_kv(k_cache, v_cache, k, v, slots)
    qsl = np.concatenate([[0], np.cumsum([n for n, _ in seqs])]).astype(np.int32)
    seq_lens = np.array([ctx for _, ctx in seqs], np.int32)
    q = (rng.standard_normal((int(qsl[-1]), n_heads, head_dim)) * q_scale).astype(np.float32)
    meta = AttentionMetadata(qsl, seq_lens, tables, np.zeros(len(q), np.int32), np.zeros(len(q), np.int32),
                             max(n for n, _ in seqs), int(seq_lens.max()), BLOCK, qsl, seq_lens)  # fmt: skip
    return q, k_cache, v_cache, meta


def write_attention_case(
    directory: Path, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta
) -> None:
    """The files the emulator's attention harnesses read: q, the metadata arrays, float16 caches."""
    for name, a in (
        ("q", q),
        ("qsl", meta.query_start_loc),
        ("seq_lens", meta.seq_lens),
        ("tables", meta.block_tables),
    ):
        a.tofile(directory / f"{name}.bin")
    k_cache.astype(np.float16).tofile(directory / "k.bin")
    v_cache.astype(np.float16).tofile(directory / "v.bin")


def fp8_caches(rng, k_cache: np.ndarray, v_cache: np.ndarray, spread: int = 6) -> tuple[Fp8KvCache, Fp8KvCache]:
    """The float32 caches' values, each (block, KV head) times its own power of two in
    [2^-spread, 2^spread] (so the block scales differ), written into FP8 caches (fp8_kv.Fp8KvCache)
    slot by slot in order."""
    num_blocks, block, n_kv, head_dim = k_cache.shape
    out = []
    for cache in (k_cache, v_cache):
        gain = np.exp2(rng.integers(-spread, spread + 1, (num_blocks, 1, n_kv, 1))).astype(np.float32)
        fp8 = Fp8KvCache.zeros(num_blocks, block, n_kv, head_dim)
        fp8.write((cache * gain).reshape(-1, n_kv, head_dim), np.arange(num_blocks * block))
        out.append(fp8)
    return out[0], out[1]


def write_fp8_caches(directory: Path, k_cache: Fp8KvCache, v_cache: Fp8KvCache) -> None:
    """The FP8 caches as the emulator harnesses built with KV_FP8=1 read them: codes, then scales."""
    for name, cache in (("k", k_cache), ("v", v_cache)):
        cache.data.tofile(directory / f"{name}.bin")
        cache.scale.tofile(directory / f"{name[0]}s.bin")


# Split formats (safetensors): how each layout is made for a kernel test.
SPLIT_KINDS = ("fp8-block", "fp8-channel-bf16", "fp8-tensor", "nvfp4", "mxfp4")


def random_split_tensor(
    kind: str, rows: int, cols: int, rng: np.random.Generator, name: str = "w"
) -> QuantizedTensor:
    """A split-format tensor of `kind` (SPLIT_KINDS): FP8 and NVFP4 quantized from normal weights by
    app.engine.quant.split's quantizers, MXFP4 random codes with e8m0 scales near 2^-5."""
    from app.engine.quant.dispatch import ScaleGrid
    from app.engine.quant.split import quantize_fp8, quantize_nvfp4

    values = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.05)
    if kind.startswith("fp8"):
        group = {"fp8-block": (128, 128), "fp8-channel-bf16": (1, cols), "fp8-tensor": (rows, cols)}[kind]
        codes, scales = quantize_fp8(values, group)
        grid = ScaleGrid(scales, "F32", group)
        if kind == "fp8-channel-bf16":  # bf16 scales: the top halves (truncated) of the float32 ones
            grid = ScaleGrid((scales.view(np.uint32) >> 16).astype(np.uint16), "BF16", group)
        return QuantizedTensor(name, QUANT_TYPES["FP8_E4M3"], (rows, cols), codes, grid)
    if kind == "nvfp4":
        packed, scale_codes, global_scale = quantize_nvfp4(values)
        grid = ScaleGrid(scale_codes, "F8_E4M3", (1, 16), global_scale)
        return QuantizedTensor(name, QUANT_TYPES["NVFP4_SPLIT"], (rows, cols), packed, grid)
    if kind == "mxfp4":
        codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        grid = ScaleGrid(rng.integers(119, 124, (rows, cols // 32), dtype=np.uint8), "E8M0", (1, 32))
        return QuantizedTensor(name, QUANT_TYPES["MXFP4_SPLIT"], (rows, cols), codes, grid)
    raise ValueError(f"unknown split kind {kind!r}; expected one of {SPLIT_KINDS}")


def shared_prefix_case(rng, shared_blocks: int, own: list[int], heads: tuple[int, int, int], block: int):
    """A decode batch (numpy) whose block tables start with the same `shared_blocks` block ids, then
    `own[i]` keys each in blocks of their own (shuffled ids); every key float16-exact."""
    n_heads, n_kv, head_dim = heads
    ctxs = [shared_blocks * block + n for n in own]
    per_seq = [-(-c // block) for c in ctxs]
    n_blocks = shared_blocks + sum(p - shared_blocks for p in per_seq) + 2
    order = rng.permutation(n_blocks)
    tables = np.zeros((len(ctxs), max(per_seq) + 1), np.int32)
    tables[:, :shared_blocks] = order[:shared_blocks]
    used = shared_blocks
    for i, p in enumerate(per_seq):
        tables[i, shared_blocks:p] = order[used : used + p - shared_blocks]
        used += p - shared_blocks
    shape = (n_blocks, block, n_kv, head_dim)
    k_cache, v_cache = (rng.standard_normal(shape).astype(np.float16).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((len(ctxs), n_heads, head_dim)).astype(np.float32)
    seq_lens = np.array(ctxs, np.int32)
    qsl = np.arange(len(ctxs) + 1, dtype=np.int32)
    meta = AttentionMetadata(qsl, seq_lens, tables, np.zeros(len(ctxs), np.int32), seq_lens - 1, 1,
                             int(seq_lens.max()), block, qsl, seq_lens)  # fmt: skip
    return q, k_cache, v_cache, meta


def assert_greedy_agrees(got: dict, ref: dict, label: str) -> None:
    """Greedy tokens of a GPU run equal the numpy reference's, but where the reference's top two
    logprobs are a near-tie: there a float32 reordering may pick the other, and the texts split."""
    pairs = zip(got["token_ids"], ref["token_ids"], strict=True)
    split = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if split is not None:
        top = ref["logprobs"][split].top
        assert abs(top[0][1] - top[1][1]) < 5e-2, f"{label}: split at {split} without a near-tie"


def assert_runs_agree(got: list[dict], ref: list[dict], label: str) -> None:
    """Each GPU generation as numpy's: the first step's top logprobs within 5e-2, the greedy tokens as
    `assert_greedy_agrees` allows."""
    for one, theirs in zip(got, ref, strict=True):
        for token, value in theirs["logprobs"][0].top:
            assert abs(dict(one["logprobs"][0].top).get(token, -99.0) - value) < 5e-2, f"{label}: token {token}"
        assert_greedy_agrees(one, theirs, label)


def assert_top_agrees(mine: list, theirs: list, tol: float, where: str) -> None:
    """numpy's top log-probs `theirs` within `tol` of a GPU run's `mine`; a token numpy ranks last that the GPU
    ranks just past its list (a near-tie at the list's edge) must lie below the GPU's last by no more than `tol`."""
    top = dict(mine)
    for token, value in theirs:
        if token in top:
            assert abs(top[token] - value) < tol, f"{where}: token {token}: {top[token]} vs numpy's {value}"
        else:
            assert value < min(top.values()) + tol, f"{where}: numpy's token {token} ({value}) not in {mine}"


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
