"""Where images sit in a prompt: the runs of the image (soft) token the chat template's image
placeholders expand to, one run per image view."""

from __future__ import annotations

from collections.abc import Sequence


def image_spans(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """`[start, end)` of each maximal run of `image_token_id`, in prompt order."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, token in enumerate(token_ids):
        if token == image_token_id and start is None:
            start = i
        elif token != image_token_id and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(token_ids)))
    return spans
