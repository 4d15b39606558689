"""Reranking: order documents by relevance to a query, and say which scorer did it.

`rerank()` is what `POST /v1/rerank` and the Studio's retrieval call. The scorer is a
`Reranker`; two exist:

- `EmbeddingCosineReranker` ("embedding-cosine"): cosine similarity of the query's and
  each document's embedding. Always available (the default embedder ships with the app).
  Scores are raw cosines in [-1, 1], not probabilities.
- `YesNoReranker` ("decoder-yes-no"): a Qwen3-Reranker-style decoder judges each
  (query, document) pair; the score is P("yes") against P("no") at the final position,
  in [0, 1]. It needs a function giving the decoder's final-position logits, which the
  decoder engine supplies once a reranker model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from app.engine.embeddings import Embedder, load_default_embedder
from app.engine.embeddings.base import check_texts

EMBEDDING_COSINE = "embedding-cosine"
DECODER_YES_NO = "decoder-yes-no"


class RankedDocument(NamedTuple):
    index: int  # position in the request's document list
    relevance_score: float


@dataclass(frozen=True)
class DocumentScores:
    """One score per document, in input order; higher means more relevant."""

    scores: list[float]
    total_tokens: int  # tokens the scorer read, for the response's usage
    truncated: list[bool]  # documents whose tail the scorer could not read
    query_truncated: bool = False


@dataclass(frozen=True)
class Ranking:
    method: str  # which scorer ran: EMBEDDING_COSINE or DECODER_YES_NO
    model: str
    results: list[RankedDocument]  # best first, at most top_n
    total_tokens: int
    truncated_documents: list[int]  # indices of documents scored on their beginning only
    query_truncated: bool


@runtime_checkable
class Reranker(Protocol):
    method: str
    model_name: str

    def score(self, query: str, documents: list[str]) -> DocumentScores: ...


class EmbeddingCosineReranker:
    method = EMBEDDING_COSINE

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.model_name = embedder.model_name

    def score(self, query: str, documents: list[str]) -> DocumentScores:
        # An instruction-tuned embedder (Qwen3-Embedding) reads the query after its task instruction.
        query_texts = getattr(self.embedder, "query_texts", None)
        result = self.embedder.encode([query_texts([query])[0] if query_texts else query, *documents])
        # Rows are unit vectors, so the dot product is the cosine.
        cosines = result.vectors[1:] @ result.vectors[0]
        return DocumentScores(
            [float(c) for c in cosines], result.total_tokens, result.truncated[1:], result.truncated[0]
        )


# -- the decoder scorer's seam --------------------------------------------------------

QWEN3_RERANKER_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
_QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def qwen3_reranker_prompt(query: str, document: str, instruction: str = QWEN3_RERANKER_INSTRUCTION) -> str:
    """The prompt Qwen3-Reranker was trained on; the model answers "yes" or "no" next."""
    return (
        f"{_QWEN3_PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{_QWEN3_SUFFIX}"
    )


def yes_probability(logit_yes: np.ndarray, logit_no: np.ndarray) -> np.ndarray:
    """P("yes") from a softmax over just the two answer tokens (numerically stable)."""
    margin = np.asarray(logit_no, dtype=np.float64) - np.asarray(logit_yes, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, margin))  # 1 / (1 + e^margin) without overflow


# prompts -> (final-position logits [n, vocab], prompt token counts)
FinalLogitsFn = Callable[[list[str]], tuple[np.ndarray, list[int]]]


class YesNoReranker:
    """A decoder that judges relevance: score = P("yes") vs P("no") after the prompt."""

    method = DECODER_YES_NO

    def __init__(
        self,
        model_name: str,
        final_logits: FinalLogitsFn,
        yes_token_id: int,
        no_token_id: int,
        instruction: str = QWEN3_RERANKER_INSTRUCTION,
        prompt_format: Callable[[str, str, str], str] = qwen3_reranker_prompt,
    ) -> None:
        self.model_name = model_name
        self.final_logits = final_logits
        self.yes_token_id = yes_token_id
        self.no_token_id = no_token_id
        self.instruction = instruction
        self.prompt_format = prompt_format

    def score(self, query: str, documents: list[str]) -> DocumentScores:
        if not documents:
            return DocumentScores([], 0, [])
        prompts = [self.prompt_format(query, document, self.instruction) for document in documents]
        logits, token_counts = self.final_logits(prompts)
        logits = np.asarray(logits)
        if logits.ndim != 2 or logits.shape[0] != len(prompts):
            raise ValueError(f"final_logits returned shape {logits.shape}, expected [{len(prompts)}, vocab]")
        p_yes = yes_probability(logits[:, self.yes_token_id], logits[:, self.no_token_id])
        # Over-long prompts are the decoder engine's to reject (400), never trimmed here.
        return DocumentScores([float(p) for p in p_yes], sum(token_counts), [False] * len(documents))


# -- ranking --------------------------------------------------------------------------


def rank(scores: list[float], top_n: int | None = None) -> list[RankedDocument]:
    """Indices by descending score (ties keep input order), cut to `top_n`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if top_n is not None:
        order = order[:top_n]
    return [RankedDocument(i, scores[i]) for i in order]


def default_reranker() -> EmbeddingCosineReranker:
    return EmbeddingCosineReranker(load_default_embedder())


def rerank(
    query: str, documents: list[str], top_n: int | None = None, reranker: Reranker | None = None
) -> Ranking:
    """Rank `documents` for `query`, best first; the default embedder scores when no reranker is given.

    `top_n` None returns every document; a `top_n` above the document count returns them all.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, got {type(query).__name__}")
    if not query.strip():
        raise ValueError("query is empty")
    documents = check_texts(documents, "documents")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ValueError(f"top_n must be a positive integer, got {top_n!r}")
    scorer = reranker if reranker is not None else default_reranker()
    scored = scorer.score(query, documents) if documents else DocumentScores([], 0, [])
    if len(scored.scores) != len(documents):
        raise RuntimeError(
            f"{scorer.method} scorer returned {len(scored.scores)} scores for {len(documents)} documents"
        )
    truncated = [i for i, cut in enumerate(scored.truncated) if cut]
    return Ranking(
        scorer.method,
        scorer.model_name,
        rank(scored.scores, top_n),
        scored.total_tokens,
        truncated,
        scored.query_truncated,
    )
