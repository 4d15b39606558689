"""How one request wants its tokens chosen, and when it wants to stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.text.grammar import GrammarSpec

MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    `temperature == 0` means greedy. `top_k <= 0`, `top_p == 1` and `min_p == 0` switch
    those filters off. `logprobs` is the number of top alternatives returned per generated
    token (0: only the chosen token's own logprob; None: no logprobs at all). `grammar`: what
    the output must match (a JSON schema, any JSON object, a Lark grammar), enforced by a token
    mask while sampling; the request stops on EOS once it is complete.
    """

    max_tokens: int | None = 256  # None: until the context is full
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range."""
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.min_tokens >= 0, "min_tokens must be >= 0"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens must not exceed max_tokens",
            ),
            (self.temperature >= 0.0, "temperature must be >= 0"),
            (self.top_k >= -1, "top_k must be -1, 0 (off) or a positive count"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0.0, "repetition_penalty must be > 0"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.grammar is not None:
            from app.engine.text.grammar import GrammarSpec

            if not isinstance(self.grammar, GrammarSpec):
                raise ValueError(f"grammar must be a GrammarSpec, not {type(self.grammar).__name__}")
