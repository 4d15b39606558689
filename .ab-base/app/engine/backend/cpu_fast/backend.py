"""The numpy backend with its products on numba kernels that read the GGUF blocks directly.

Only what streams weights, and decode attention, change: `load_weight` keeps each quantized matrix as its file's
bytes (`FastWeight`, no float32 copy), and `linear` / `embedding` run the kernels of
kernels.py, and a decode step's `attention` runs attention.py's kernel over the paged cache in place.
Everything else (norms, RoPE, attention, the fused ops' compositions) is the
numpy backend's, inherited, so the two backends differ only in the products' summation order.

Routing in `linear`: one activation row (decode) goes through `gemv`, which reads the weight rows in
place; 2 to GEMV_MAX_ROWS rows (verify chunks, small batches) through `gemm_rows`, each weight row
decoded once into an L1 buffer for all of them; more rows (prefill) decode the weight in
tiles of rows and multiply each tile by BLAS (`x @ tile.T`), so the float32 weights exist only
a tile at a time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cpu_fast import blas, kernels
from app.engine.backend.cpu_fast.attention import attention_decode, causal_softmax
from app.engine.backend.cpu_fast.weights import FAST_FORMATS, FastWeight, half_table
from app.engine.backend.cpu_weights import CpuFusedWeight
from app.engine.quant.dispatch import QuantizedTensor

# one activation row (a decode step) goes through `gemv`, which reads the weights in place; 2 to this
# many (a speculative verify chunk, a small batch) through `gemm_rows`, which decodes each weight row once
# for all of them; above it, tiles + BLAS
GEMV_MAX_ROWS = 16
TILE_VALUES = 1 << 21  # float32 values per decoded tile (8 MiB): L3-sized, enough rows for BLAS
ATTENTION_CHUNK = 64  # prefill queries per causal chunk: small enough to skip most masked keys
# chunks of at most this many queries (decodes, speculative verify chunks) attend as that many decodes
# on the decode kernel: a query's result is then the same as a one-token step's (the same kernel, the same
# order of sums), and a few queries over a long context skip the prefill path's gather and BLAS set-up
QUERY_ROWS_AS_DECODES = 16


class FastCpuBackend(CpuBackend):
    name = "cpu"
    kernels = "numba"

    def __init__(self, threads: int | None = None) -> None:
        import numba

        limit = numba.config.NUMBA_NUM_THREADS
        if threads is not None and not 1 <= threads <= limit:
            raise ValueError(f"--threads must be between 1 and {limit} (the cores numba sees), got {threads}")
        self.threads = threads or limit
        # numba's thread count is per calling thread, and the engine steps on its own thread: set it
        # at every launch. The lock keeps two engines' threads from entering numba's pool at once
        # (the workqueue layer, numba's fallback where no OpenMP/TBB is found, aborts on that).
        self._set_threads = numba.set_num_threads
        self._lock = threading.Lock()
        self._local = threading.local()  # each tile worker's decode buffer
        self._pool: ThreadPoolExecutor | None = None

    def load_weight(self, tensor: QuantizedTensor) -> Any:
        # the kernels read rows in groups of kernels.GROUP values; other rows (a float matrix of 48
        # columns: the tiny hybrid fixtures) stay on the numpy path
        grouped = len(tensor.shape) == 2 and tensor.shape[1] % kernels.GROUP == 0
        if grouped and tensor.qtype.name in FAST_FORMATS:
            return FastWeight(tensor)
        return super().load_weight(tensor)

    def embedding(self, weight: Any, token_ids: np.ndarray) -> np.ndarray:
        if not isinstance(weight, FastWeight):
            return super().embedding(weight, token_ids)
        with self._lock:
            self._set_threads(self.threads)
            return weight.rows(np.asarray(token_ids, dtype=np.int64))

    def linear(self, x: np.ndarray, weight: Any, bias: np.ndarray | None = None) -> np.ndarray:
        parts = weight.parts if isinstance(weight, CpuFusedWeight) else (weight,)
        biases = weight.biases if isinstance(weight, CpuFusedWeight) else (bias,)
        if isinstance(weight, CpuFusedWeight) and bias is not None:
            raise ValueError("a fused weight carries its own biases")
        if not all(isinstance(p, FastWeight) for p in parts):
            return super().linear(x, weight, bias)
        if x.ndim != 2:  # rows of any leading shape, as the reference's `x @ w.T` takes them
            flat = self.linear(x.reshape(-1, x.shape[-1]), weight, bias)
            return flat.reshape(*x.shape[:-1], flat.shape[-1])
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], sum(p.shape[0] for p in parts)), np.float32)
        with self._lock:
            self._set_threads(self.threads)
            col = 0
            for part in parts:
                self._product(x, part, out, col)
                col += part.shape[0]
        for b, start, stop in _bias_columns(parts, biases):
            out[:, start:stop] += b
        return out

    def attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None, softcap=None, sinks=None):
        """Over a float32 cache: decode steps (one query token per sequence) on the numba kernel,
        prefill chunks as BLAS products around one numba pass of mask and softmax. Float16 (numba
        has no half type) and FP8 caches, attention sinks and image spans keep the reference."""
        plain = isinstance(k_cache, np.ndarray) and k_cache.dtype == np.float32
        if not (plain and sinks is None and meta.image_spans is None):
            return super().attention(q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks)
        starts = meta.host_query_start_loc if meta.host_query_start_loc is not None else meta.query_start_loc
        seq_lens = meta.host_seq_lens if meta.host_seq_lens is not None else meta.seq_lens
        window, cap = int(sliding_window or 0), float(softcap or 0.0)
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.empty(q.shape, np.float32)
        with self._lock:
            self._set_threads(self.threads)
            if meta.max_query_len <= QUERY_ROWS_AS_DECODES:
                tables, starts, seq_lens = _as_decodes(np.asarray(meta.block_tables, dtype=np.int32),
                                                       np.asarray(starts), np.asarray(seq_lens))  # fmt: skip
                attention_decode(
                    q, k_cache, v_cache, tables, starts, seq_lens, float(scale), window, cap, out
                )
                return out
            for i in range(len(seq_lens)):
                first, last = int(starts[i]), int(starts[i + 1])
                rows = slice(first, last)
                self._prefill(q[rows], k_cache, v_cache, meta.block_tables[i], int(seq_lens[i]), scale, window, cap,
                              out[rows])  # fmt: skip
        return out

    def _prefill(self, q, k_cache, v_cache, table, ctx: int, scale: float, window: int, cap: float, out) -> None:
        """One sequence's prefill chunk in causal chunks of ATTENTION_CHUNK queries, each over only
        the keys up to its last query (about half the products of one full square at a fresh
        prompt), spread over the workers largest first, each on a one-thread BLAS."""
        n_q = q.shape[0]
        block_size = k_cache.shape[1]
        blocks = np.asarray(table[: -(-ctx // block_size)], dtype=np.int64)
        keys = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:ctx]
        values = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:ctx]
        chunks = [(a, min(n_q, a + ATTENTION_CHUNK)) for a in range(0, n_q, ATTENTION_CHUNK)][::-1]
        if len(chunks) == 1 or not _threadsafe_numba():
            for a, b in chunks:
                out[a:b] = _attend(q[a:b], keys, values, ctx - n_q + b, scale, window, cap)
            return

        def work(chunk: tuple[int, int]) -> None:
            self._set_threads(1)
            a, b = chunk
            out[a:b] = _attend(q[a:b], keys, values, ctx - n_q + b, scale, window, cap)

        with blas.one_thread():
            list(self._workers().map(work, chunks))

    def _workers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cpu-tiles")
        return self._pool

    def _product(self, x: np.ndarray, weight: FastWeight, out: np.ndarray, col0: int) -> None:
        n_out, n_in = weight.shape
        if x.shape[0] == 1:
            sums = x.reshape(1, n_in // kernels.GROUP, kernels.GROUP).sum(axis=-1)
            weight.kernels.gemv(weight.data, half_table(), x, sums, out, col0, kernels.GROUP)
            return
        if x.shape[0] <= GEMV_MAX_ROWS:
            weight.kernels.gemm_rows(weight.data, half_table(), x, out, col0, kernels.GROUP)
            return
        rows = max(16, min(-(-n_out // self.threads), TILE_VALUES // n_in))  # a tile per worker at least
        tiles = [(start, min(n_out, start + rows)) for start in range(0, n_out, rows)]
        if len(tiles) == 1 or not _threadsafe_numba():
            for tile in tiles:
                self._tile_product(x, weight, out, col0, tile, rows)
            return

        # Tiles over our own workers, each on a one-thread BLAS (blas.py says why) and running its
        # numba regions on itself (numba's thread count is per calling thread).
        def work(tile: tuple[int, int]) -> None:
            self._set_threads(1)
            self._tile_product(x, weight, out, col0, tile, rows)

        with blas.one_thread():
            list(self._workers().map(work, tiles))

    def _tile_product(self, x, weight: FastWeight, out, col0: int, tile: tuple[int, int], rows: int) -> None:
        """`out[:, col0 + start : col0 + stop] = x @ decode(rows start:stop).T`, in this thread's buffer."""
        start, stop = tile
        n_in = weight.shape[1]
        buf = getattr(self._local, "tile", None)
        if buf is None or buf.size < rows * n_in:
            buf = self._local.tile = np.empty(rows * n_in, np.float32)
        decoded = weight.tile(start, buf[: (stop - start) * n_in].reshape(stop - start, n_in))
        np.matmul(x, decoded.T, out=out[:, col0 + start : col0 + stop])


def _threadsafe_numba() -> bool:
    """Whether numba's threading layer takes parallel regions from two threads at once (OpenMP and
    TBB do; the workqueue fallback aborts the process)."""
    import numba

    try:
        return numba.threading_layer() in ("omp", "tbb")
    except ValueError:  # no parallel region has run yet
        return False


def _attend(q, keys, values, ctx: int, scale: float, window: int, softcap: float) -> np.ndarray:
    """Queries `q [n_q, n_heads, d]`, the last `n_q` of `ctx` positions, over `keys`/`values [>= ctx,
    n_kv, d]`: the reference's products (query heads that share a KV head stacked as rows), with
    `causal_softmax` between them."""
    n_q, n_heads, d = q.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    keys, values = keys[:ctx], values[:ctx]
    qs = q.reshape(n_q, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n_q, d)
    probs = np.matmul(qs, keys.transpose(1, 2, 0))  # [n_kv, group * n_q, ctx]
    causal_softmax(probs, n_q, ctx, float(scale), window, softcap)
    ctx_out = np.matmul(probs, values.transpose(1, 0, 2))  # [n_kv, group * n_q, d]
    return ctx_out.reshape(n_kv, group, n_q, d).transpose(2, 0, 1, 3).reshape(n_q, n_heads, d)


def _as_decodes(tables: np.ndarray, starts: np.ndarray, seq_lens: np.ndarray) -> tuple[np.ndarray, ...]:
    """A step's queries as one-token sequences for `attention_decode`: query j of a sequence whose chunk
    has n queries over ctx positions sees its first ctx - n + 1 + j keys, through the same block table."""
    counts = np.diff(starts).astype(np.int64)
    if (counts == 1).all():
        return tables, starts.astype(np.int32), seq_lens.astype(np.int32)
    seq = np.repeat(np.arange(len(counts)), counts)
    rows = np.arange(int(counts.sum()), dtype=np.int64)
    within = rows - starts[:-1].astype(np.int64)[seq]
    lens = seq_lens.astype(np.int64)[seq] - counts[seq] + 1 + within
    return np.ascontiguousarray(tables[seq]), rows.astype(np.int32), lens.astype(np.int32)


def _bias_columns(parts, biases):
    """(bias, first column, end column) of each part that has a bias."""
    col = 0
    for part, bias in zip(parts, biases, strict=True):
        if bias is not None:
            yield bias, col, col + part.shape[0]
        col += part.shape[0]
