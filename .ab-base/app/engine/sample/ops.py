"""The numpy sampler's arithmetic on logit rows: grammar masks, penalties, the top-k / top-p / min-p
filters and the inverse-CDF draw (sampler.py says the order and semantics)."""

from __future__ import annotations

import numpy as np

from app.engine.request import Request
from app.engine.sample.history import TokenHistory

FIRST_NUCLEUS_WIDTH = 64  # top-p looks at this many best tokens first, widening only if needed


def apply_token_bitmask(rows: np.ndarray, bitmask: np.ndarray) -> None:
    """Set to -inf, in place, each logit whose bit is clear in its row's mask (int32 words, bit t
    of word t // 32 for token t: `sample/grammar.py`)."""
    as_bytes = np.ascontiguousarray(bitmask, dtype="<i4").view(np.uint8)
    allowed = np.unpackbits(as_bytes, axis=1, count=rows.shape[1], bitorder="little")
    rows[allowed == 0] = -np.inf


def apply_penalties(row: np.ndarray, request: Request) -> None:
    """Repetition (HF: divide positive logits, multiply negative ones, over every token
    seen), then frequency and presence (OpenAI: subtract per output occurrence / once)."""
    p = request.sampling_params
    history = TokenHistory.of(request)
    if p.repetition_penalty != 1.0:
        seen = history.seen
        values = row[seen]
        row[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and len(history.output_ids):
        counts = history.output_counts
        row[history.output_ids] -= (p.frequency_penalty * counts + p.presence_penalty).astype(np.float32)


def draw_among_top_k(
    rows: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p_cut: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Rows with top-k: one partition to the widest k, then every filter and the draw on
    those few candidates (ties at a row's k-th value are kept; beyond the widest k, dropped)."""
    vocab, widest = rows.shape[1], int(top_k.max())
    ids = np.argpartition(rows, vocab - widest, axis=1)[:, vocab - widest :]
    values = np.take_along_axis(rows, ids, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")  # best first
    ids, values = np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)
    index = np.arange(len(rows))
    keep = values >= values[index, top_k - 1][:, None]
    weights = np.where(keep, np.exp(values - values[:, :1], dtype=np.float64), 0.0)
    probs = weights / weights.sum(axis=1, keepdims=True)
    before = np.cumsum(probs, axis=1) - probs  # top-p: on the distribution top-k left
    keep &= (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep &= values >= min_p_cut[:, None]
    cdf = np.cumsum(np.where(keep, weights, 0.0), axis=1)
    targets = uniforms * cdf[:, -1]
    # the first position whose cdf exceeds the target: always a kept token
    return ids[index, np.minimum((cdf <= targets[:, None]).sum(axis=1), widest - 1)]


def draw_full_width(
    rows: np.ndarray, row_max: np.ndarray, top_p: np.ndarray, min_p_cut: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Rows without top-k: a logit threshold from top-p and min-p, then the draw."""
    weights = np.exp(rows - row_max[:, None])
    cut = min_p_cut.astype(np.float32)
    nucleus = np.flatnonzero(top_p < 1.0)
    if nucleus.size:
        nucleus_cuts = nucleus_cut(rows[nucleus], weights[nucleus], row_max[nucleus], top_p[nucleus])
        cut[nucleus] = np.maximum(cut[nucleus], nucleus_cuts)
    filtered = np.flatnonzero(np.isfinite(cut))
    if filtered.size:
        weights[filtered] = np.where(rows[filtered] < cut[filtered, None], 0.0, weights[filtered])
    return inverse_cdf(weights, uniforms)


def inverse_cdf(weights: np.ndarray, uniforms: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """Per row, the token where `uniform * total` falls in the cumulative weights. Two levels
    (chunk sums, then one chunk) instead of a cumulative sum over the whole vocabulary."""
    rows, vocab = weights.shape
    chunk = min(chunk, vocab)
    starts = np.arange(0, vocab, chunk)
    chunk_cdf = np.cumsum(np.add.reduceat(weights, starts, axis=1, dtype=np.float64), axis=1)
    targets = uniforms * chunk_cdf[:, -1]
    picked = np.minimum((chunk_cdf <= targets[:, None]).sum(axis=1), len(starts) - 1)
    index = np.arange(rows)
    offsets = targets - np.where(picked > 0, chunk_cdf[index, picked - 1], 0.0)
    columns = starts[picked, None] + np.arange(chunk)
    inside = np.where(columns < vocab, weights[index[:, None], np.minimum(columns, vocab - 1)], 0.0)
    position = (np.cumsum(inside, axis=1, dtype=np.float64) <= offsets[:, None]).sum(axis=1)
    # rounding must never land past the chunk's last token of positive weight
    last_positive = chunk - 1 - np.argmax(inside[:, ::-1] > 0, axis=1)
    return starts[picked] + np.minimum(position, last_positive)


def nucleus_cut(rows: np.ndarray, weights: np.ndarray, row_max: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Per row, the smallest logit inside the top-p nucleus (the fewest best tokens whose
    probability adds up to at least top_p). Looks at the best few tokens first and widens
    only for rows whose nucleus is wider, so a full sort of the vocabulary is rare."""
    vocab = rows.shape[1]
    total = weights.sum(axis=1, dtype=np.float64)
    cuts = np.empty(len(rows), dtype=np.float32)
    pending = np.arange(len(rows))
    width = FIRST_NUCLEUS_WIDTH
    while pending.size:
        width = min(width, vocab)
        sub = rows[pending]
        best = -np.sort(-np.partition(sub, vocab - width, axis=1)[:, vocab - width :], axis=1)
        probs = np.exp(best - row_max[pending, None], dtype=np.float64) / total[pending, None]
        inclusive = np.cumsum(probs, axis=1)
        # covered: the mass seen reaches top_p, or only filtered-out (-inf) tokens lie beyond
        covered = (inclusive[:, -1] >= top_p[pending]) | (width == vocab) | np.isneginf(best[:, -1])
        # a token is in the nucleus while the mass before it is below top_p
        num_kept = ((inclusive - probs) < top_p[pending, None]).sum(axis=1)
        done = pending[covered]
        cuts[done] = best[covered, num_kept[covered] - 1]
        # widen by at least 8x, more where the mass seen so far is far from top_p; a partition
        # wider than a quarter of the vocabulary costs about a sort, so sort then
        seen, wanted = inclusive[~covered, -1], top_p[pending[~covered]]
        pending = pending[~covered]
        if pending.size:
            estimate = int(width * 2 * (wanted / np.maximum(seen, 1e-12)).max())
            width = max(width * 8, estimate)
            width = vocab if width > vocab // 4 else width
    return cuts
