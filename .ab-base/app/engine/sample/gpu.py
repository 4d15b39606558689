"""Batched sampling on the GPU: logits never leave the device, only the chosen ids do.

Same order and semantics as the numpy `Sampler` (the reference): logprobs from the raw
logits, then grammar masks, temperature, top-k, top-p and min-p as logit thresholds, then one draw.
The draw is Gumbel-max (argmax of logits/T plus Gumbel noise) with noise hashed from
(seed, output position, token id), so a seeded request repeats exactly and never depends
on the rest of the batch. The random streams differ from the numpy sampler's, so seeded
outputs differ between backends (as they do between vLLM and llama.cpp).

min_tokens bans (EOS and stop ids set to -inf until the request has its minimum output)
are applied on the GPU: benchmark workloads (aiperf's `min_tokens` = `max_tokens`) put
every row under a ban for its whole life. Rows with repetition/frequency/presence
penalties need the request's token history: those rows alone are copied to the host and
sampled by the numpy reference.

Grammar masks are computed on the host (llguidance, sample/grammar.py) for the rows that have a
grammar, uploaded with one copy per step and applied by one kernel; those rows always take
`sample()`, since their matchers need each chosen token before the next mask.

Two ways to sample: `sample()` waits for the ids (the synchronous engine step, and any batch
with penalties or logprobs); `launch()` only enqueues, leaving the ids on the device as the next
step's input (core/pipeline.py) with an asynchronous copy to the host behind them, which
`GpuPendingSample.resolve()` waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.request import Request, TokenLogprob
from app.engine.sample.grammar import GrammarMasks, mask_words
from app.engine.sample.sampler import (
    GREEDY_BELOW,
    Sampler,
    SamplerOutput,
    constrained,
    deferrable,
    penalised,
)

_THREADS = 256
_SLICE = 4096  # logits per block: a 150k vocabulary is ~38 blocks per row, 16 logits per thread


def _ids(best: np.ndarray) -> list[int]:
    """Token ids from the packed keys (0: no candidate survived the cutoff, take id 0)."""
    ids = np.uint64(0xFFFFFFFF) - (best & np.uint64(0xFFFFFFFF))
    return np.where(best == 0, 0, ids).astype(np.int64).tolist()


class GpuPendingSample:
    """A sample enqueued on the GPU: `device_ids` (int32 [rows]) can feed the next step at once;
    `resolve()` waits for their copy into pinned host memory and reads it."""

    def __init__(self, device_ids: Any, host_ids: np.ndarray, copied: Any) -> None:
        self.device_ids = device_ids
        self._host_ids = host_ids
        self._copied = copied

    def resolve(self) -> SamplerOutput:
        self._copied.synchronize()  # an event wait: releases the GIL, as _wait_without_gil
        token_ids = self._host_ids.tolist()
        return SamplerOutput(token_ids, [None] * len(token_ids))


class GpuSampler:
    def __init__(
        self, eos_token_ids: frozenset[int], default_seed: int = 0, grammars: GrammarMasks | None = None
    ) -> None:
        import cupy

        self.xp = cupy
        self.host = Sampler(eos_token_ids, default_seed, grammars)  # rows that need token histories
        self.default_seed = default_seed
        self._kernel = get_kernel("sampling.cu", "gumbel_argmax")
        self._ban_kernel = get_kernel("sampling.cu", "ban_tokens")
        self._unpack_kernel = get_kernel("sampling.cu", "unpack_ids")
        self._mask_kernel = get_kernel("sampling.cu", "apply_token_bitmask")
        self._unseeded = 0
        self._uploads = _PinnedRing(cupy, np.uint8, 24 * 64)  # per-row parameters and ban pairs
        self._downloads = _PinnedRing(cupy, np.int32, 64)  # launched samples' ids
        self._mask_uploads = _PinnedRing(cupy, np.int32, 8 * (1 + 8192))  # grammar rows, masks
        self._device_params: Any = None
        self._device_masks: Any = None

    def start(self, request: Request) -> None:
        self.host.start(request)

    def forget(self, request_id: str) -> None:
        self.host.forget(request_id)

    def sample(self, logits: Any, requests: Sequence[Request]) -> SamplerOutput:
        """Sample and wait for the ids (rows with penalties go through the numpy sampler)."""
        xp = self.xp
        on_host = [i for i, r in enumerate(requests) if penalised(r)]  # rows that need their history
        host_rows = set(on_host)
        best = self._draw(logits, requests, host_rows)
        _wait_without_gil(xp)  # let the API thread run while the GPU finishes the step
        token_ids = _ids(xp.asnumpy(best))  # the one device-to-host copy of the step
        if on_host:
            host_rows = self.host.sample(
                xp.asnumpy(logits[xp.asarray(on_host)]), [requests[i] for i in on_host]
            )
            for i, token in zip(on_host, host_rows.token_ids, strict=True):
                token_ids[i] = token
        on_device = [i for i in range(len(requests)) if i not in host_rows]
        self.host.advance_grammars([requests[i] for i in on_device], [token_ids[i] for i in on_device])
        return SamplerOutput(token_ids, self._logprobs(logits, requests, token_ids))

    def launch(self, logits: Any, requests: Sequence[Request]) -> GpuPendingSample:
        """Enqueue the sample, the ids as int32 on the device, their asynchronous copy to pinned
        host memory and an event after it, all on the current stream; wait for nothing."""
        if not all(deferrable(r) for r in requests):
            raise ValueError("rows with penalties, logprobs or a grammar need sample(): it waits for ids")
        xp = self.xp
        n = len(requests)
        best = self._draw(logits, requests, set())
        ids = xp.empty(n, dtype=xp.int32)
        self._unpack_kernel((-(-n // 128),), (128,), (best, ids, np.int32(n)))
        host = self._downloads.take(n)
        stream = xp.cuda.get_current_stream()
        runtime = xp.cuda.runtime
        runtime.memcpyAsync(host.ctypes.data, ids.data.ptr, 4 * n, runtime.memcpyDeviceToHost, stream.ptr)
        copied = xp.cuda.Event(disable_timing=True)
        copied.record(stream)
        return GpuPendingSample(ids, host, copied)

    def _draw(self, logits: Any, requests: Sequence[Request], on_host: set[int]) -> Any:
        """Enqueue grammar masks, bans, cutoffs and the draw of every row but `on_host`; the packed
        keys (uint64 [rows], see gumbel_argmax). `logits` keep their raw values where logprobs are
        asked for (masks and bans then go to a copy); otherwise those entries become -inf in place."""
        xp = self.xp
        n = len(requests)
        params = [r.sampling_params for r in requests]
        vocab = logits.shape[1]
        greedy = np.array([p.temperature < GREEDY_BELOW for p in params])
        inv_t = np.where(greedy, 1.0, 1.0 / np.maximum([p.temperature for p in params], GREEDY_BELOW))
        bans = self._ban_pairs(requests, on_host, vocab)
        upload = self._upload_params(requests, inv_t, greedy, bans)
        masked = [i for i, r in enumerate(requests) if i not in on_host and constrained(r)]
        if (bans.size or masked) and any(p.logprobs is not None for p in params):
            logits = logits.copy()  # logprobs come from the raw logits
        if masked:
            self._apply_masks(logits, requests, masked)
        if bans.size:
            count = bans.size // 2
            self._ban_kernel((-(-count // 128),), (128,), (logits, upload[24 * n :], np.int32(count), np.int32(vocab)))
        filtered = [p.min_p > 0 or 0 < p.top_k < vocab or p.top_p < 1.0 for p in params]
        cutoff = self._cutoffs(logits, params, inv_t.astype(np.float32)) if any(filtered) else None
        best = xp.zeros(n, dtype=xp.uint64)
        self._kernel(
            (n, -(-vocab // _SLICE)), (_THREADS,),
            (logits, upload, cutoff if cutoff is not None else np.uint64(0), np.int32(n), np.int32(vocab), best),
        )  # fmt: skip
        return best

    def _apply_masks(self, logits: Any, requests: Sequence[Request], rows: list[int]) -> None:
        """The grammar masks of `rows`, filled on the host into one pinned buffer after their row
        numbers, one copy to the device, then -inf where a mask's bit is clear."""
        xp, grammars = self.xp, self.host.grammars
        assert grammars is not None, "a request with a grammar was not started"
        count, vocab = len(rows), logits.shape[1]
        words = mask_words(vocab)
        assert grammars.words == words, f"grammar masks cover {grammars.vocab_size} tokens, logits {vocab}"
        size = count * (1 + words)
        host = self._mask_uploads.take(size)
        host[:count] = rows
        grammars.fill([requests[i] for i in rows], host[count:].reshape(count, words))
        if self._device_masks is None or self._device_masks.size < size:
            self._device_masks = xp.empty(size, xp.int32)
        device = self._device_masks[:size]
        device.set(host, stream=xp.cuda.get_current_stream())
        self._mask_kernel(
            (-(-vocab // _THREADS), count), (_THREADS,),
            (logits, device[count:], device[:count], np.int32(words), np.int32(vocab)),
        )  # fmt: skip

    def _ban_pairs(self, requests: Sequence[Request], on_host: set[int], vocab: int) -> np.ndarray:
        """(row, token id) pairs, flat int32, for the rows under a min_tokens ban (the numpy
        sampler bans the host rows itself)."""
        pairs = [
            (row, token)
            for row, request in enumerate(requests)
            if row not in on_host
            for token in self.host.banned(request)
            if 0 <= token < vocab  # an id outside the vocabulary can never be drawn anyway
        ]
        return np.asarray(pairs, dtype=np.int32).reshape(-1)

    def _upload_params(
        self, requests: Sequence[Request], inv_t: np.ndarray, greedy: np.ndarray, bans: np.ndarray
    ) -> Any:
        """The kernels' per-row parameters (24 bytes a row) and the ban pairs after them, in one
        pinned buffer, one host-to-device copy. The device buffer is reused at once: the next
        copy into it is queued on the same stream behind the kernels that read this one."""
        xp = self.xp
        n = len(requests)
        size = 24 * n + 4 * bans.size
        host = self._uploads.take(size)
        if self._device_params is None or self._device_params.size < size:
            self._device_params = xp.empty(max(size, 24 * 64), xp.uint8)
        seeds, steps = self._seeds(requests)
        host[: 8 * n].view(np.uint64)[:] = seeds
        host[8 * n : 16 * n].view(np.uint64)[:] = steps
        host[16 * n : 20 * n].view(np.float32)[:] = inv_t
        host[20 * n : 24 * n].view(np.int32)[:] = greedy
        host[24 * n : size].view(np.int32)[:] = bans
        device = self._device_params[:size]
        device.set(host[:size], stream=xp.cuda.get_current_stream())
        return device

    def _seeds(self, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
        seeds = np.empty(len(requests), dtype=np.uint64)
        for i, r in enumerate(requests):
            if r.sampling_params.seed is not None:
                seeds[i] = r.sampling_params.seed
            else:  # unseeded: a fresh stream per draw, derived from the engine's seed
                self._unseeded += 1
                seeds[i] = (self.default_seed << 32) + self._unseeded
        # a verify chunk's k+1 rows (one request, consecutive: spec/verify.py) are output positions
        # n, n+1, ..., so each draws its own noise, the very noise decoding without drafts would draw
        # there: a seeded request's tokens are the same with and without drafts
        steps = np.empty(len(requests), dtype=np.uint64)
        previous, repeat = None, 0
        for i, r in enumerate(requests):
            repeat = repeat + 1 if r is previous else 0
            previous = r
            steps[i] = r.num_output_tokens + repeat
        return seeds, steps

    def _cutoffs(self, logits: Any, params: list, inv_t: np.ndarray) -> Any:
        """Per row, the smallest scaled logit top-k, top-p and min-p keep (-inf: keep all)."""
        xp = self.xp
        n, vocab = logits.shape
        cut = xp.full(n, -np.inf, dtype=xp.float32)
        row_max = logits.max(axis=1) * xp.asarray(inv_t)
        min_p = np.array([p.min_p for p in params])
        if (min_p > 0).any():
            with np.errstate(divide="ignore"):
                cut = xp.maximum(cut, row_max + xp.asarray(np.log(min_p), dtype=xp.float32))
        rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
        if rows:
            index = xp.asarray(rows)
            scaled = logits[index] * xp.asarray(inv_t[rows])[:, None]
            ordered = -xp.sort(-scaled, axis=1)  # best first
            top_k = np.array([params[i].top_k if 0 < params[i].top_k < vocab else vocab for i in rows])
            kth = ordered[xp.arange(len(rows)), xp.asarray(top_k - 1)]
            probs = xp.exp(ordered - ordered[:, :1])
            probs = xp.where(xp.arange(vocab)[None, :] < xp.asarray(top_k)[:, None], probs, 0.0)
            probs /= probs.sum(axis=1, keepdims=True)
            before = xp.cumsum(probs, axis=1) - probs
            top_p = xp.asarray(np.array([params[i].top_p for i in rows]), dtype=xp.float32)
            kept = xp.maximum(((before < top_p[:, None]) | (top_p[:, None] >= 1.0)).sum(axis=1), 1)
            nucleus = ordered[xp.arange(len(rows)), kept - 1]
            cut[index] = xp.maximum(cut[index], xp.maximum(kth, nucleus))
        return cut

    def _logprobs(
        self, logits: Any, requests: Sequence[Request], token_ids: list[int]
    ) -> list[TokenLogprob | None]:
        xp = self.xp
        result: list[TokenLogprob | None] = [None] * len(requests)
        rows = [i for i, r in enumerate(requests) if r.sampling_params.logprobs is not None]
        if not rows:
            return result
        values = logits[xp.asarray(rows)]
        row_max = values.max(axis=1, keepdims=True)
        log_total = row_max[:, 0] + xp.log(xp.exp(values - row_max).sum(axis=1))
        widest = max(requests[i].sampling_params.logprobs or 0 for i in rows)
        order = xp.argsort(-values, axis=1)[:, : max(widest, 1)]
        top = xp.asnumpy(xp.take_along_axis(values, order, axis=1) - log_total[:, None])
        order = xp.asnumpy(order)
        chosen = xp.asnumpy(
            values[xp.arange(len(rows)), xp.asarray([token_ids[i] for i in rows])] - log_total
        )
        for j, i in enumerate(rows):
            count = requests[i].sampling_params.logprobs or 0
            pairs = tuple(zip(order[j, :count].tolist(), top[j, :count].tolist(), strict=True))
            result[i] = TokenLogprob(token_ids[i], float(chosen[j]), pairs)
        return result


class _PinnedRing:
    """Two pinned host buffers taken in turn, for copies that run after the host moves on.

    With at most one step in flight (core/pipeline.py), the buffer a step takes is taken again
    two steps later, and by then the step that used it was resolved: its event, recorded on the
    same stream after this buffer's copy, was waited for, so the copy is done. (A step takes at
    most one buffer of each ring; a synchronous step waits before it returns.)"""

    def __init__(self, xp: Any, dtype: Any, min_size: int) -> None:
        self._xp, self._dtype, self._min_size = xp, np.dtype(dtype), min_size
        self._buffers: list[np.ndarray | None] = [None, None]
        self._turn = 0

    def take(self, size: int) -> np.ndarray:
        """The next buffer's first `size` items. A buffer too small is replaced; its last copy
        is done (see above), so dropping it is safe."""
        turn, self._turn = self._turn, self._turn ^ 1
        buffer = self._buffers[turn]
        if buffer is None or buffer.size < size:
            capacity = max(size, self._min_size)
            memory = self._xp.cuda.alloc_pinned_memory(capacity * self._dtype.itemsize)
            buffer = self._buffers[turn] = np.frombuffer(memory, self._dtype, capacity)
        return buffer[:size]


def _wait_without_gil(xp: Any) -> None:
    """Wait for the GPU on an event: CuPy releases the GIL in cudaEventSynchronize, so the thread
    that streams results to clients runs meanwhile. (A blocking copy would hold the GIL for the
    whole GPU step; polling with short sleeps overshot by ~40 us a step, measured on the H200:
    Linux sleeps at least its 50 us timer slack.)"""
    event = xp.cuda.Event(disable_timing=True)
    event.record()
    event.synchronize()
