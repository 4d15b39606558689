"""Whole prompts through a decoder outside the generation loop: last-token embeddings
(the Qwen3-Embedding recipe) and final-position logits (Qwen3-Reranker-style scoring).

A prompt is prefilled through the same paged KV cache and model runner as generation,
in chunks of the engine's token budget, on blocks that are released at once. Nothing is
sampled. These calls must run on the thread that owns the engine: with an `AsyncEngine`,
go through `AsyncEngine.call`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from app.engine.core.scheduler import ScheduledChunk
from app.engine.request import Request
from app.engine.sampling_params import SamplingParams

_ids = itertools.count()

# Qwen3-Embedding's recipe (its model card): a query is prefixed with its task, documents are not;
# the text ends with <|endoftext|> (its tokenizer.json appends it) and that token's state is pooled.
QWEN3_EMBEDDING_TASK = "Given a web search query, retrieve relevant passages that answer the query"
POOLED_TOKEN = "<|endoftext|>"
MRL_MIN_DIMENSIONS = 32  # the model cards allow any output size from 32 up to the hidden size


def query_prompt(instruction: str = QWEN3_EMBEDDING_TASK) -> str:
    """The text put before a query: `Instruct: {task}\nQuery:` (the query follows without a space)."""
    return f"Instruct: {instruction}\nQuery:"


class PromptRunner:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def last_hidden(self, prompts: list[list[int]]) -> np.ndarray:
        """Final-norm hidden state of each prompt's last token, float32 `[n, hidden]`."""
        return np.stack([self._run(ids, logits=False) for ids in prompts])

    def final_logits(self, prompts: list[list[int]]) -> np.ndarray:
        """Vocabulary logits after each prompt's last token, float32 `[n, vocab]`."""
        return np.stack([self._run(ids, logits=True) for ids in prompts])

    def _run(self, ids: list[int], logits: bool) -> np.ndarray:
        engine = self.engine
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if len(ids) > engine.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; this model takes at most {engine.max_model_len}")
        request = Request(f"pool-{next(_ids)}", list(ids), SamplingParams(max_tokens=1))
        if not engine.kv.allocate(request, len(ids)):
            raise RuntimeError("the KV cache is full right now; retry when running requests finish")
        try:
            budget = engine.config.max_num_batched_tokens
            for start in range(0, len(ids), budget):
                count = min(budget, len(ids) - start)
                chunk = ScheduledChunk(request, start, count, samples=start + count == len(ids))
                hidden = engine.runner.last_hidden([chunk])
                request.num_computed_tokens += count
            row = engine.model.logits(hidden) if logits else hidden
            return engine.backend.to_host(row)[0].astype(np.float32)
        finally:
            engine.kv.free(request)


class DecoderEmbedder:
    """A decoder as an `Embedder`: last-token pooling, L2-normalised (Qwen3-Embedding).

    `run_on_engine(fn)` runs `fn()` where the engine may be used: directly for a bare
    `LLMEngine`, `lambda fn: async_engine.call(fn).result()` under an `AsyncEngine`, or a
    `TaskModel`'s `run` for a model loaded beside the chat model. `query_prefix` is what
    `embed_queries` puts before each query; any output size from `min_dimensions` up to
    `dimensions` may be asked of `embed` (Matryoshka: the leading components, renormalised).
    """

    def __init__(
        self,
        engine: Any,
        run_on_engine: Callable[[Callable[[], Any]], Any] | None = None,
        query_prefix: str | None = None,
    ) -> None:
        self.engine = engine
        self.runner = PromptRunner(engine)
        self.run_on_engine = run_on_engine or (lambda fn: fn())
        self.model_name = engine.info.name
        self.dimensions = engine.model_config.hidden_size
        self.min_dimensions = min(MRL_MIN_DIMENSIONS, self.dimensions)
        self.max_tokens = engine.max_model_len
        self.query_prefix = query_prompt() if query_prefix is None else query_prefix
        tokenizer = engine.tokenizer
        pooled = tokenizer.token_to_id(POOLED_TOKEN)
        self._end_id = pooled if pooled is not None else tokenizer.eos_token_id

    def _ids(self, text: str) -> list[int]:
        ids = self.engine.tokenizer.encode(text)
        # The recipe pools the end-of-text token Qwen3-Embedding's tokenizer appends; add it if this
        # one does not.
        if self._end_id is not None and (not ids or ids[-1] != self._end_id):
            ids.append(self._end_id)
        return ids

    def query_texts(self, texts: list[str], instruction: str | None = None) -> list[str]:
        """Queries as the model reads them: after the task instruction (the default task when None)."""
        prefix = self.query_prefix if instruction is None else query_prompt(instruction)
        return [prefix + text for text in texts]

    def embed_queries(self, texts: list[str], instruction: str | None = None) -> np.ndarray:
        return self.embed(self.query_texts(texts, instruction))

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(self._ids(text)) for text in texts]

    def embed(self, texts: list[str], dimensions: int | None = None) -> np.ndarray:
        if dimensions is not None and not self.min_dimensions <= dimensions <= self.dimensions:
            raise ValueError(
                f"{self.model_name} gives {self.min_dimensions} to {self.dimensions} dimensions, "
                f"not {dimensions}"
            )
        prompts = [self._ids(text) for text in texts]
        vectors = self.run_on_engine(lambda: self.runner.last_hidden(prompts))
        return unit_rows(vectors[:, :dimensions] if dimensions else vectors)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1, float32 (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def decoder_reranker(engine: Any, run_on_engine: Callable[[Callable[[], Any]], Any] | None = None) -> Any:
    """A Qwen3-Reranker-style scorer over the loaded decoder: P("yes") against P("no")."""
    from app.engine.tasks.rerank import YesNoReranker

    runner, run = PromptRunner(engine), run_on_engine or (lambda fn: fn())
    tokenizer = engine.tokenizer
    yes, no = tokenizer.encode("yes", add_special_tokens=False), tokenizer.encode("no", add_special_tokens=False)
    if len(yes) != 1 or len(no) != 1:
        raise ValueError(f"{engine.info.name}: 'yes' and 'no' are not single tokens; it cannot score as a reranker")

    def final_logits(prompts: list[str]) -> tuple[np.ndarray, list[int]]:
        ids = [tokenizer.encode(p) for p in prompts]
        return run(lambda: runner.final_logits(ids)), [len(i) for i in ids]

    return YesNoReranker(engine.info.name, final_logits, yes[0], no[0])
