"""The draft-model drafter (`--speculative draft --draft-model PATH`): a second, small model of the
same tokenizer proposes k tokens greedily; the target verifies them in one step (spec/verify.py), as
it does prompt-lookup drafts.

The draft model runs in an engine of its own (its own runner, KV cache and scheduler; speculative
decoding off), one request per proposal. Its KV stays in step with each request's accepted tokens
through that engine's prefix cache: a proposal's prompt is the request's tokens so far, whose full
blocks were computed (and cached) by the previous proposal, so only the tail since the last block
boundary and the k drafted tokens are computed again. Rejected drafts' blocks hash differently from
the accepted tokens and simply age out of the cache. This keeps no per-request state outside the
cache, so preemption, aborts and the target's prefix cache need nothing from the drafter.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from app.engine.config import EngineConfig
from app.engine.loader.tokenizer import Tokenizer
from app.engine.sampling_params import SamplingParams

TOKEN_SAMPLE = 64  # token strings compared between the two tokenizers, spread over the vocabulary


class DraftEngine(Protocol):
    """The draft model's LLMEngine (built by core/engine.py: this module sits below it)."""

    max_model_len: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[dict[str, Any]]: ...


class DraftModelDrafter:
    def __init__(self, engine: DraftEngine, target_vocab: int) -> None:
        self.engine = engine
        self.target_vocab = target_vocab  # rows of the target's logits: a draft id past them is no draft

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens the draft model decodes greedily after `tokens` (none where they would not
        fit its context)."""
        if k < 1 or len(tokens) + k > self.engine.max_model_len:
            return []
        params = SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True)
        drafts = self.engine.generate([tokens], params)[0]["token_ids"]
        kept = next((i for i, t in enumerate(drafts) if t >= self.target_vocab), len(drafts))
        return drafts[:kept]


def draft_config(config: EngineConfig, max_model_len: int) -> EngineConfig:
    """The draft model's engine: the target's device, kernels and KV layout, within its context, one
    request at a time and no drafts of its own. On a GPU it is built after the target took its share
    of the free memory, and takes half of that share of what is left: the target's step buffers need
    the rest."""
    assert config.draft_model is not None
    return EngineConfig(
        model=config.draft_model, device=config.device, max_model_len=max_model_len, max_num_seqs=1,
        max_num_batched_tokens=config.max_num_batched_tokens, block_size=config.block_size,
        kv_cache_bytes=config.kv_cache_bytes, gpu_memory_utilization=max(0.05, config.gpu_memory_utilization / 2),
        kv_dtype=config.kv_dtype, cuda_graphs=config.cuda_graphs, cpu_kernels=config.cpu_kernels,
        threads=config.threads,
    )  # fmt: skip


def check_same_tokenizer(target: Tokenizer, draft: Tokenizer, target_path: str, draft_path: str) -> None:
    """Drafts are token ids: they mean the same text only if both models share a vocabulary. Compare
    the sizes and a sample of token strings spread over it."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"draft model {draft_path} has a vocabulary of {draft.vocab_size} tokens, the model "
                         f"{target_path} has {target.vocab_size}: a draft model needs the same tokenizer")  # fmt: skip
    for token_id in np.unique(np.linspace(0, target.vocab_size - 1, TOKEN_SAMPLE).astype(int)).tolist():
        ours, theirs = target.id_to_token(token_id), draft.id_to_token(token_id)
        if ours != theirs:
            raise ValueError(f"draft model {draft_path} and model {target_path} have different tokenizers: "
                             f"token {token_id} is {theirs!r} in the first, {ours!r} in the second")  # fmt: skip
