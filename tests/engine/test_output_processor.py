"""OutputProcessor's streamed text around stop strings: what is held back, and when."""

from __future__ import annotations

import pytest

from app.engine.core.output_processor import OutputProcessor, stop_prefix_at_end
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams

PIECES = {1: " w12", 2: " w7", 3: "<|", 4: "im_", 5: "end|>", 6: " tail", 7: "<", 8: "x"}


class _Detokenizer:
    def add(self, ids: list[int]) -> str:
        return "".join(PIECES[i] for i in ids)

    def flush(self) -> str:
        return ""


class _Tokenizer:
    eos_token_ids = frozenset({0})

    def detokenizer(self, skip_special_tokens: bool = True) -> _Detokenizer:
        return _Detokenizer()


def _stream(ids: list[int], stop: list[str]) -> tuple[list[str], RequestStatus | None]:
    """The new_text of each step's output, feeding one id per step, and the finish status."""
    processor = OutputProcessor(_Tokenizer(), max_model_len=1000)
    request = Request("r", [5, 6], SamplingParams(max_tokens=50, stop=stop))
    request.status = RequestStatus.RUNNING
    processor.add(request)
    texts, status = [], None
    for token_id in ids:
        request.output_token_ids.append(token_id)
        status = processor.process(request, token_id, None)
        if status is not None:
            request.status = status
        texts.append(processor.output(request).new_text)
        if status is not None:
            break
    return texts, status


def test_text_that_cannot_begin_a_stop_string_is_shown_at_once() -> None:
    texts, status = _stream([1, 2, 6], ["<|im_end|>"])
    assert texts == [" w12", " w7", " tail"]
    assert status is None


def test_a_forming_stop_string_is_held_then_cut() -> None:
    texts, status = _stream([1, 3, 4, 5, 6], ["<|im_end|>"])
    assert texts == [" w12", "", "", ""]  # "<|", "<|im_" held; the whole stop is cut, never shown
    assert status == RequestStatus.FINISHED_STOPPED


def test_a_held_tail_that_stops_matching_is_released() -> None:
    texts, _ = _stream([1, 7, 8, 6], ["<|im_end|>"])
    assert texts == [" w12", "", "<x", " tail"]
    assert "".join(texts) == " w12<x tail"


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [("abc", ["xyz"], 0), ("ab<|im", ["<|im_end|>"], 4), ("a\n\n", ["\n\nUser:", "\n"], 2), ("", ["<|"], 0),
     ("x<", ["<|"], 1)],
)  # fmt: skip
def test_stop_prefix_at_end(text: str, stops: list[str], held: int) -> None:
    assert stop_prefix_at_end(text, stops) == held
