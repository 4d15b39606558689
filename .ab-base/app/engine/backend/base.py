"""The op set every backend implements, with one signature for numpy and CUDA.

Layers call these ops; nothing above the backend touches numpy or cupy arrays directly
except through `backend.xp`. Activations are 2-D `[tokens, features]` (or 3-D
`[tokens, heads, head_dim]` around attention) in the backend's activation dtype.
The numpy backend (`cpu.py`) is the reference: the CUDA backend is tested against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import GatedDeltaNetSpec

Array = Any  # numpy.ndarray on the CPU backend, cupy.ndarray on CUDA


@dataclass
class AttentionMetadata:
    """Where each sequence's new tokens sit in the flat batch and in the paged KV cache.

    A batch mixes prefill chunks and decodes: sequence `i` owns flat tokens
    `query_start_loc[i]:query_start_loc[i+1]`, which are its last tokens; its context
    after this step is `seq_lens[i]` tokens whose KV lives in blocks `block_tables[i]`.
    Token `t` sits at absolute position `positions[t]` and writes its KV to cache slot
    `slot_mapping[t]` (= block_id * block_size + offset).
    """

    query_start_loc: Array  # int32 [B + 1]
    seq_lens: Array  # int32 [B]
    block_tables: Array  # int32 [B, max_blocks_per_seq], unused entries are 0
    slot_mapping: Array  # int32 [T]
    positions: Array  # int32 [T]
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies, for backends that loop over sequences on the host (numpy does).
    host_query_start_loc: np.ndarray | None = None
    host_seq_lens: np.ndarray | None = None
    # Per sequence, absolute position spans [start, end) whose tokens attend both ways (an image's
    # soft tokens); None for text-only steps. Set, the step runs `reference_attention`'s path.
    image_spans: list[list[tuple[int, int]]] | None = None
    # A decode batch whose rows share the blocks leading their block tables (the CUDA decode graphs
    # set it; attention_cascade.py): a hint that reads those keys once. The result is the same
    # attention, so backends without a cascade path ignore it.
    shared_prefix: SharedPrefix | None = None
    # M-RoPE (Qwen2.5-VL) steps with images: each flat token's own cos/sin row, replacing the layers'
    # tables at `positions` (which keep placing the KV and the causal mask). Set, the step runs
    # `reference_attention`'s path too.
    rope: RopeTable | None = None
    # Hybrid models (recurrent layers: Gated DeltaNet, Mamba-2; see models/config.py): sequence i's
    # row in every recurrent layer's state arrays `[num_slots, ...]`, and whether its chunk continues
    # the state held there (False: the chunk starts at position 0, and the layer starts from zeros
    # without reading the row). None on models without recurrent layers.
    state_slots: Array | None = None  # int32 [B]
    has_initial_state: Array | None = None  # bool [B]
    host_state_slots: np.ndarray | None = None
    host_has_initial_state: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1


@dataclass(frozen=True)
class SharedPrefix:
    """Keys [0, length) that every row of a decode batch reads through the same blocks, as device
    arrays a CUDA graph's replays refill: `length` int32 [1]; the batch's n rows as one pseudo sequence,
    `query_start_loc` int32 [2] = (0, n) and `seq_len` int32 [1] = length - 1 + n (so each row sits
    past every shared key)."""

    query_start_loc: Array
    seq_len: Array
    length: Array


@dataclass(frozen=True)
class RopeTable:
    """cos/sin of every (position, frequency) pair, `[max_positions, rotary_dim // 2]` float32."""

    cos: Array
    sin: Array


@dataclass(frozen=True)
class QkvRope:
    """What `rope_and_cache` takes besides the step's data: one attention layer's constants."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    q_norm: Array | None
    k_norm: Array | None
    eps: float
    table: RopeTable
    interleaved: bool


class Backend(Protocol):
    name: str  # "cpu" or "cuda"
    xp: Any  # the array module: numpy or cupy
    act_dtype: Any

    # -- memory -------------------------------------------------------------------
    def from_host(self, array: np.ndarray, dtype: Any = None) -> Array: ...
    def to_host(self, array: Array) -> np.ndarray: ...
    def load_weight(self, tensor: QuantizedTensor) -> Any:
        """Take a checkpoint tensor into the backend, keeping its quantized layout."""
        ...

    def alloc_kv_cache(
        self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: str = "auto"
    ) -> tuple[Array, Array]:
        """K and V caches of one layer, each `[num_blocks, block_size, n_kv_heads, head_dim]` in
        `dtype` ("auto": the backend's `kv_dtype`; "float16", "float32", "fp8": an FP8 cache with
        per-block scales, backend/fp8_kv.py). A dtype the backend cannot run raises ValueError."""
        ...

    # -- whole KV blocks for the offload tiers (backend/kv_blocks.py: the payload layout) ----
    def alloc_host_blocks(self, num_blocks: int, block_nbytes: int) -> np.ndarray:
        """Host rows for `num_blocks` block payloads, uint8 (pinned on CUDA)."""
        ...

    def read_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], out: Sequence[np.ndarray]) -> None:
        """Copy the payloads of `block_ids` (every layer) into host rows `out` (a `[n, block_nbytes]` array
        or n separate rows), all in one gather per cache leaf; may be asynchronous: `out` is valid after
        `sync_kv_copies()`."""
        ...

    def write_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], src: Sequence[np.ndarray]) -> None:
        """Copy host payload rows `src` (as `out` above) into `block_ids`, one scatter per cache leaf,
        ordered after every `read_kv_blocks` before it and before the next step's work; may be
        asynchronous: `src` may be rewritten by the host after `sync_kv_copies()`."""
        ...

    def sync_kv_copies(self) -> None:
        """Wait until every block copy so far is done: `read_kv_blocks`' rows landed, `write_kv_blocks`'
        rows read."""
        ...

    def rope_table(self, cos: np.ndarray, sin: np.ndarray) -> RopeTable: ...

    # -- ops ----------------------------------------------------------------------
    def embedding(self, weight: Any, token_ids: Array) -> Array:
        """Rows `token_ids` of a `[vocab, hidden]` weight, dequantized: `[T, hidden]`."""
        ...

    def linear(self, x: Array, weight: Any, bias: Array | None = None) -> Array:
        """`x @ weight.T (+ bias)` for `x [T, in]` and a `[out, in]` weight: `[T, out]`.

        `weight` may be a fused weight (`fuse_linear`); it carries its own biases, so
        `bias` must then be None."""
        ...

    # -- fused ops: one launch where the unfused composition would take several. Each is
    # defined as that composition, which the numpy backend runs literally (bit for bit).

    def fuse_linear(self, weights: Sequence[Any], biases: Sequence[Array | None]) -> Any:
        """Loaded weights `[out_i, in]` that multiply the same input, as one `[sum out_i, in]` weight:
        `linear(x, fused)` == `concatenate([linear(x, w_i, b_i) for each i], axis=-1)`.

        The parts keep their own formats (a Q4_K_M file mixes Q4_K q/k with a Q6_K v) and
        stay usable on their own."""
        ...

    def gated_linear(self, x: Array, gate_up: Any, kind: str, then: Any = None) -> Array:
        """`gated_activation(linear(x, gate), linear(x, up), kind)` for
        `gate_up = fuse_linear([gate, up], [None, None])` (two parts of one shape). `then`: as in
        `add_rms_norm_gated_linear`."""
        ...

    def add_rms_norm_linear(
        self, x: Array, residual: Array | None, norm_weight: Array, eps: float, weight: Any
    ) -> tuple[Array, Array]:
        """`(linear(normed, weight), new_residual)` for `normed, new_residual =
        add_and_norm(self, x, residual, norm_weight, eps)`: the norm in front of q/k/v."""
        ...

    def add_rms_norm_gated_linear(
        self, x: Array, residual: Array | None, norm_weight: Array, eps: float, gate_up: Any, kind: str,
        then: Any = None,
    ) -> tuple[Array, Array]:  # fmt: skip
        """`(gated_linear(normed, gate_up, kind), new_residual)`, normed as in `add_rms_norm_linear`.
        `then`: the weight the gated result goes into next (the down projection), or None. A backend may
        give the result in the form that product reads (CUDA: float16 for a product on a float16 copy, the
        rounding that product would apply itself); `linear` takes it either way."""
        ...

    def rope_and_cache(
        self,
        qkv: Array,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        q_norm: Array | None,
        k_norm: Array | None,
        eps: float,
        positions: Array,
        table: RopeTable,
        interleaved: bool,
        k_cache: Array,
        v_cache: Array,
        slot_mapping: Array,
    ) -> Array:
        """Attention's inputs from `qkv [T, (n_heads + 2 n_kv_heads) * head_dim]` (q, k and v
        side by side, as `linear` of a fused q/k/v weight gives them). Exactly::

            q, k, v = the three column ranges, reshaped to [T, heads, head_dim]
            if q_norm is not None:  # per-head QK norm (Qwen3, Gemma 3); k_norm comes with it
                q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
            q, k = rope(q, positions, table, interleaved), rope(k, positions, table, interleaved)
            write_kv(k_cache, v_cache, k, v, slot_mapping)
            return q  # [T, n_heads, head_dim]
        """
        ...

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """RMS-normalize over the last axis and scale by `weight` (x may be 2-D or 3-D)."""
        ...

    def add_rms_norm(self, x: Array, residual: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        """`residual + x` and its RMS norm: returns `(normed, new_residual)`."""
        ...

    def rms_norm_join(self, x: Array, weight: Array, eps: float, join: Array, scale: Array | None = None) -> Array:
        """`(rms_norm(x, weight) + join) * scale`: a normalised sublayer output joining the residual stream
        (Gemma's post-norms; `scale` a one-element array, None for 1), in one launch where the backend can."""
        ...

    def rms_norm_pair(self, x: Array, weight: Array, weight2: Array, eps: float) -> tuple[Array, Array]:
        """`(rms_norm(x, weight), rms_norm(x, weight2))`: one row norm under two weights, one launch where the
        backend can (Gemma 4's router and experts read the same stream)."""
        ...

    def rms_norm_heads(self, x: Array, start: int, heads: int, weight: Array, eps: float) -> Array:
        """`x [T, W]` with its `heads` runs of `weight.size` columns from `start` each RMS-normalised (Gemma 4's
        value heads inside the fused q/k/v product); in place where the backend can: use the result."""
        ...

    def rope(self, x: Array, positions: Array, table: RopeTable, interleaved: bool) -> Array:
        """Rotate `x [T, heads, head_dim]` by each token's position.

        `interleaved` pairs (0,1), (2,3)... (GGUF llama layout); otherwise (i, i + d/2)
        (NeoX / Hugging Face layout).
        """
        ...

    def gated_activation(self, gate: Array, up: Array, kind: str) -> Array:
        """`act(gate) * up` with `kind` "silu" or "gelu_tanh"."""
        ...

    def write_kv(self, k_cache: Array, v_cache: Array, k: Array, v: Array, slot_mapping: Array) -> None:
        """Store `k, v [T, n_kv_heads, head_dim]` at their cache slots."""
        ...

    def attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> Array:
        """Causal paged attention of `q [T, n_heads, head_dim]` over the cached context.

        Grouped-query: head h reads KV head `h // (n_heads // n_kv_heads)`. With a
        sliding window W, the token at position p sees keys at positions p-W+1 .. p.
        A backend with `supports_attention_sinks` also takes `sinks [n_heads]` (GPT-OSS): head h's
        softmax gets one more logit `sinks[h]` in its denominator, which weighs no value.
        """
        ...

    def rope_cache_attention(
        self,
        qkv: Array,
        rope: QkvRope,
        k_cache: Array,
        v_cache: Array,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
        then: Any = None,
    ) -> Array:
        """`attention(rope_and_cache(qkv, ...), ...)` (rope_cache_then_attention): one launch where
        the backend fuses them (CUDA at decode). `then`: the weight the output goes into next (the output
        projection), or None; as in `add_rms_norm_gated_linear`, a backend may give the output in the form
        that product reads (CUDA: float16 for a product on a float16 copy)."""
        ...

    def softcap(self, x: Array, cap: float) -> Array:
        """`cap * tanh(x / cap)`."""
        ...

    def output_gate(self, out: Array, gate: Array, kind: str) -> Array:
        """The attention output `out [T, W]` times f(`gate`), f "sigmoid" or "softplus"; `gate` is
        `[T, W]` or `[T, heads]` (one column per head, broadcast over its W / heads dims), and its
        rows may be strided (a column slice of the fused projection)."""
        ...

    # -- recurrent layers of hybrid models (recurrent_reference.py and ssd_reference.py have the math) --
    # Whether these ops read the step's sequences on the host (the references), which no CUDA graph
    # can hold; False where every sequence's bounds, state row and start are read on the device.
    recurrent_syncs_host: bool

    def causal_conv1d(
        self, x: Array, weight: Array, bias: Array | None, conv_state: Array, meta: AttentionMetadata,
        silu: bool = True,
    ) -> Array:
        """recurrent_reference.causal_conv1d: the depthwise causal conv `[T, C]` of each sequence (rows of
        `x` may be strided), continuing and updating its row of `conv_state [slots, C, K-1]` (Gated
        DeltaNet, Mamba-2)."""
        ...

    def gated_delta_net_rule(
        self, mixed: Array, ba: Array, neg_a: Array, dt_bias: Array, state: Array, meta: AttentionMetadata,
        spec: GatedDeltaNetSpec,
    ) -> Array:
        """recurrent_reference.gated_delta_net_rule: Gated DeltaNet's gates and delta rule, `[T, Hv, Dv]`,
        continuing and updating each sequence's row of `state [slots, Hv, Dk, Dv]`."""
        ...

    def gated_rms_norm(self, x: Array, z: Array, weight: Array, eps: float) -> Array:
        """recurrent_reference.gated_rms_norm: RMSNorm of `x [T, H, D]` per head times silu(`z [T, H D]`)."""
        ...

    def gated_delta_net_mixer(
        self, qkv: Array, conv_weight: Array, conv_state: Array, ba: Array, neg_a: Array, dt_bias: Array,
        state: Array, meta: AttentionMetadata, spec: GatedDeltaNetSpec, z: Array, norm_weight: Array, eps: float,
    ) -> Array:
        """`causal_conv1d` (SiLU, no bias) of `qkv`, `gated_delta_net_rule` of its output, `gated_rms_norm`
        of the rule's: Gated DeltaNet between its projections, one launch where the backend fuses them
        (CUDA at decode)."""
        ...

    def ssd_scan(
        self,
        x: Array,
        dt: Array,
        dt_bias: Array,
        a: Array,
        b: Array,
        c: Array,
        d: Array,
        ssm_state: Array,
        meta: AttentionMetadata,
        chunk_size: int,
    ) -> Array:
        """`ssd_reference.ssd_scan(xp, x, softplus(dt + dt_bias), a, b, c, d, ssm_state, meta, chunk_size)`
        (Mamba-2): `x [T, H, P]`, raw `dt [T, H]`, `b, c [T, G, N]` (their rows may be strided: column
        ranges of a wider activation), the float32 state rows `[slots, H, P, N]` continued per sequence of
        `meta` (`state_slots`, `has_initial_state`) and updated in place. `y [T, H, P]` with the D skip."""
        ...

    def gated_group_rms_norm(self, y: Array, z: Array, weight: Array, eps: float, groups: int) -> Array:
        """`y * silu(z)` RMS-normalised within each of `groups` equal channel groups, times `weight`:
        `[T, C]` (ssd_reference.gated_group_rms_norm)."""
        ...


def add_and_norm(
    backend: Backend, x: Array, residual: Array | None, weight: Array, eps: float
) -> tuple[Array, Array]:
    """Fold `x` into the residual stream and normalize it: `(normed, new_residual)`; with no
    residual yet (the first layer), `x` itself is the stream."""
    if residual is None:
        return backend.rms_norm(x, weight, eps), x
    return backend.add_rms_norm(x, residual, weight, eps)


def norm_then_product(
    backend: Backend,
    x: Array,
    residual: Array | None,
    norm_weight: Array,
    eps: float,
    weight: Any,
    kind: str | None,
    then: Any = None,
) -> tuple[Array, Array]:
    """The composition that `add_rms_norm_linear` (kind None) and `add_rms_norm_gated_linear`
    (kind: the activation; `then` as there) are defined as."""
    normed, new_residual = add_and_norm(backend, x, residual, norm_weight, eps)
    out = backend.linear(normed, weight) if kind is None else backend.gated_linear(normed, weight, kind, then)
    return out, new_residual


def norm_then_join(
    backend: Backend, x: Array, weight: Array, eps: float, join: Array, scale: Array | None
) -> Array:
    """The composition that `rms_norm_join` is defined as."""
    joined = backend.rms_norm(x, weight, eps) + join
    return joined if scale is None else joined * scale


def norm_each_head(backend: Backend, x: Array, start: int, heads: int, weight: Array, eps: float) -> Array:
    """The composition that `rms_norm_heads` is defined as: the runs normalised apart, then put back in a copy."""
    stop = start + heads * weight.size
    out = x.copy()
    runs = x[:, start:stop].reshape(x.shape[0], heads, weight.size)
    out[:, start:stop] = backend.rms_norm(runs, weight, eps).reshape(x.shape[0], -1)
    return out


def norm_rope_then_cache(
    backend: Backend, qkv: Array, n_heads: int, n_kv_heads: int, head_dim: int, q_norm: Array | None,
    k_norm: Array | None, eps: float, positions: Array, table: RopeTable, interleaved: bool, k_cache: Array,
    v_cache: Array, slot_mapping: Array,
) -> Array:  # fmt: skip
    """The composition that `rope_and_cache` is defined as (its docstring), op by op."""
    n_tok = qkv.shape[0]
    q_cols, kv_cols = n_heads * head_dim, n_kv_heads * head_dim
    q = qkv[:, :q_cols].reshape(n_tok, n_heads, head_dim)
    k = qkv[:, q_cols : q_cols + kv_cols].reshape(n_tok, n_kv_heads, head_dim)
    v = qkv[:, q_cols + kv_cols : q_cols + 2 * kv_cols].reshape(n_tok, n_kv_heads, head_dim)
    if q_norm is not None:
        q, k = backend.rms_norm(q, q_norm, eps), backend.rms_norm(k, k_norm, eps)
    q = backend.rope(q, positions, table, interleaved)
    k = backend.rope(k, positions, table, interleaved)
    backend.write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


def rope_cache_then_attention(
    backend: Backend,
    qkv: Array,
    rope: QkvRope,
    k_cache: Array,
    v_cache: Array,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    **attention_options: Any,
) -> Array:
    """The composition that `rope_cache_attention` is defined as; `attention_options` go to the backend's
    own `attention` (CUDA: `half_out`)."""
    q = backend.rope_and_cache(
        qkv, rope.n_heads, rope.n_kv_heads, rope.head_dim, rope.q_norm, rope.k_norm, rope.eps,
        meta.positions, rope.table, rope.interleaved, k_cache, v_cache, meta.slot_mapping,
    )  # fmt: skip
    return backend.attention(q, k_cache, v_cache, meta, scale, sliding_window, softcap, **attention_options)
