"""LLMEngine: add requests, step, abort. One step = schedule -> run -> sample -> postprocess.

With async decode on, a decode step is launched before the previous step's ids are read back,
and that step's host work runs while the GPU computes (worker/pipeline.py)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.backend import select_backend
from app.engine.cache.manager import KVCacheManager
from app.engine.cache.offload import DeviceBlocks, kv_bytes_moved
from app.engine.cache.state_cache import StateCache
from app.engine.config import DEFAULT_MODEL, EngineConfig
from app.engine.core.memory_plan import (
    cache_budget,
    expert_streaming,
    kv_dtype,
    num_kv_blocks,
    offload_tiers,
    state_cache_bytes,
    state_host_rows,
    state_rows,
    weight_cache_mode,
)
from app.engine.core.output_processor import OutputProcessor
from app.engine.core.request_log import log_finished
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.core.vision import attach_vision, place_images
from app.engine.images import ImageInput
from app.engine.interface import ContextOverflowError, EngineStats, ModelInfo
from app.engine.loader.finite import check_finite
from app.engine.loader.tokenizer import Tokenizer
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model, model_config
from app.engine.request import Request, RequestOutput, RequestStatus, TokenLogprob
from app.engine.sample.grammar import GrammarMasks
from app.engine.sample.sampler import Sampler, deferrable
from app.engine.sampling_params import SamplingParams
from app.engine.text.chat_template import chat_template_for
from app.engine.worker.pipeline import DecodePipeline, async_decode_enabled
from app.engine.worker.prefill_graphs import capture_prefill_graphs
from app.engine.worker.runner import ModelRunner, allocate_caches, attention_caches

log = logging.getLogger(__name__)

SEED_LIMIT = 2**64  # seeds are unsigned 64-bit (the GPU sampler's noise hash takes them as uint64)


def resolve_model_path(model: str) -> Path:
    """A path to a .gguf file or a model folder; "default" is the embedded Gemma 3 270M."""
    if model == DEFAULT_MODEL:
        from app.engine.loader.embedded import embedded_gguf_path

        return embedded_gguf_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {model!r} not found: no such file or folder")
    return path


def check_sampling_ids(params: SamplingParams, vocab_size: int) -> None:
    """Raise ValueError naming the field whose value no sampler can use: a seed outside uint64, a stop
    token id outside the vocabulary (it would index past the logits)."""
    if params.seed is not None and not 0 <= params.seed < SEED_LIMIT:
        raise ValueError(f"seed must be between 0 and 2**64 - 1, got {params.seed}")
    bad = next((t for t in params.stop_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"stop_token_ids: {bad} is outside the vocabulary (0..{vocab_size - 1})")


@dataclass
class _Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    cached_tokens: int = 0
    last_batch: int = 0
    max_batch: int = 0
    cached_by_tier: Counter[str] = field(default_factory=Counter)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        started = time.monotonic()
        self.path = resolve_model_path(config.model)
        self.checkpoint = open_checkpoint(self.path)
        check_finite(self.checkpoint.tensors, self.path)  # a NaN scale would make every logit NaN
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
            config.device, weight_cache_mode(config, self.model_config, self.checkpoint),
            config.cpu_kernels, config.threads,
        )  # fmt: skip

        cfg = self.model_config
        self.block_size = config.block_size
        positions = min(config.max_model_len or cfg.context_length, cfg.context_length)
        self.expert_streaming = expert_streaming(config, cfg, self.backend, self.path, positions)
        if self.expert_streaming is not None:
            self.backend.expert_streaming = self.expert_streaming
        self.model = build_model(self.checkpoint, self.backend, positions, cfg)
        # hybrid models: a recurrent-state row per sequence slot and per prefix-cache snapshot
        budget = cache_budget(config, cfg, self.backend) if cfg.is_hybrid else 0
        slots, snapshots = state_rows(config, cfg, budget)
        self.state_bytes = state_cache_bytes(cfg, slots, snapshots)
        num_blocks = num_kv_blocks(config, cfg, self.backend, positions, reserved=self.state_bytes)
        capacity = (num_blocks - 1) * self.block_size  # block 0 is the pool's null block
        self.max_model_len = min(positions, capacity)
        if config.max_model_len and config.max_model_len > self.max_model_len:
            limit = "the model's context" if positions < config.max_model_len else "what the KV cache holds"
            log.warning(
                "--max-ctx %d exceeds %s: the context is %d tokens",
                config.max_model_len, limit, self.max_model_len,
            )  # fmt: skip
        self.kv_dtype = kv_dtype(config, self.backend)
        state_rows_total = 1 + slots + snapshots if slots else 0
        kv_caches = allocate_caches(self.backend, cfg, num_blocks, self.block_size, self.kv_dtype, state_rows_total)
        self.runner = ModelRunner(self.model, self.backend, kv_caches, self.block_size)
        self.vision = attach_vision(self.runner, self.checkpoint, self.tokenizer, config.mmproj)
        if self.backend.name == "cuda" and config.cuda_graphs and cfg.is_hybrid:
            log.warning("CUDA graphs off: this hybrid model's recurrent layers walk the batch's sequences "
                        "on the host (no captured kernels for them yet)")  # fmt: skip
        elif self.backend.name == "cuda" and config.cuda_graphs and self.model.syncs_host:
            log.warning("CUDA graphs off: this model's MoE layers read the router's choices on the host "
                        "(per-expert products, or experts streamed from host RAM)")
        elif self.backend.name == "cuda" and config.cuda_graphs:
            from app.engine.worker.decode_graphs import DecodeGraphs

            self.runner.graphs = DecodeGraphs(
                self.model, self.backend, kv_caches, self.block_size, self.max_model_len, config.max_num_seqs
            )
            self.runner.graphs.capture()
            self.runner.prefill_graphs = capture_prefill_graphs(
                config.prefill_graphs, self.model, self.backend, kv_caches, self.block_size,
                self.max_model_len, self.runner.graphs.capture_stream,
            )  # fmt: skip
        tiers = None
        if cfg.is_hybrid and (config.kv_host_gb or config.kv_disk_gb):
            log.info("KV host/disk tiers off for this hybrid model (a prefix hit needs its recurrent state too); "
                     "host RAM keeps evicted state snapshots instead")  # fmt: skip
        elif cfg.attention_layers:
            copier = DeviceBlocks(self.backend, attention_caches(cfg, kv_caches))
            tiers = offload_tiers(config, copier, self.path, cfg, self.kv_dtype)
        state = None
        if slots:
            host_rows = state_host_rows(config, cfg, snapshots)
            state = StateCache(slots, snapshots, self.block_size, config.state_snapshot_interval, host_rows=host_rows)
            self.runner.allocate_host_states(host_rows)
        self.kv = KVCacheManager(
            num_blocks, self.block_size, enable_prefix_caching=config.enable_prefix_caching, tiers=tiers,
            state=state,
        )  # fmt: skip
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
            supports_vision=self.vision is not None,
            quant_mix=self.checkpoint.quant_mix,
        )
        log.info(
            "loaded %s (%s, %s) on %s in %.1f s; context %d, %d KV blocks of %d (%s), prefix cache %s",
            self.info.name, cfg.architecture, self.info.quantization, self.backend.name,
            time.monotonic() - started, self.max_model_len, num_blocks, self.block_size, self.kv_dtype,
            "on" if config.enable_prefix_caching else "off",
        )  # fmt: skip
        if state is not None:
            log.info("recurrent state: %d slots and %d prefix-cache snapshots of %.1f MiB each (%.1f MiB), "
                     "%d more snapshots in host RAM", slots, snapshots, cfg.state_bytes_per_sequence / 2**20,
                     self.state_bytes / 2**20, state.host.num_rows if state.host else 0)  # fmt: skip
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
        images: Sequence[ImageInput] = (),
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        check_sampling_ids(params, vocab)
        self.check_fits(len(prompt_token_ids), params)
        placed = place_images(self.vision, prompt_token_ids, images)
        request = Request(request_id, list(prompt_token_ids), params, session_id=session_id, images=placed)
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
        logits = self._run(scheduled)
        self._count(scheduled)
        sampling = [c.request for c in scheduled.chunks if c.samples]
        if not sampling:
            self.scheduler.update(scheduled, {})
            return ended
        logits = self._for_sampler(logits)
        if self.async_decode and all(deferrable(r) for r in sampling):
            try:
                pending = self.sampler.launch(logits, sampling)
            except Exception:  # some row broke the batched launch: sample now, row by row
                log.warning("a batched sample launch failed; sampling this step row by row", exc_info=True)
            else:
                self.pipeline.launched(scheduled, sampling, pending)
                return ended
        return ended + self._sample_now(scheduled, sampling, logits)

    def _sample_now(
        self, scheduled: SchedulerOutput, sampling: list[Request], logits: Any
    ) -> list[RequestOutput]:
        """Sample and wait for the ids, record the step and postprocess it. When the batch fails,
        each row is sampled alone: a row that still fails ends its own request, the rest go on."""
        try:
            result = self.sampler.sample(logits, sampling)
            rows = list(zip(sampling, result.token_ids, result.logprobs, strict=True))
            failed: list[RequestOutput] = []
        except Exception:
            rows, failed = self._sample_row_by_row(logits, sampling)
        rows = [row for row in rows if self._live(row[0])]  # a look-ahead's rows may have ended meanwhile
        self.scheduler.update(scheduled, {request.request_id: token for request, token, _ in rows})
        requests, token_ids = [row[0] for row in rows], [row[1] for row in rows]
        return failed + self._postprocess(requests, token_ids, [row[2] for row in rows])

    def _sample_row_by_row(
        self, logits: Any, sampling: list[Request]
    ) -> tuple[list[tuple[Request, int, TokenLogprob | None]], list[RequestOutput]]:
        """Each row sampled on its own, to find the rows whose sampling fails and end only those."""
        rows, failed = [], []
        for i, request in enumerate(sampling):
            try:
                result = self.sampler.sample(logits[i : i + 1], [request])
            except Exception as exc:
                failed.append(self._fail(request, exc, "sampling"))
                continue
            rows.append((request, result.token_ids[0], result.logprobs[0]))
        return rows, failed

    def _step_ahead(self) -> list[RequestOutput]:
        """Launch the next decode step with the in-flight step's ids as input, on the device;
        then resolve the in-flight step, whose outputs these are, while the new one runs."""
        scheduled = self.scheduler.schedule()
        sampling = self.pipeline.planned(scheduled)
        self.runner.states_before(scheduled.state)
        logits = self.runner.run_from_device(scheduled.chunks, *self.pipeline.inputs(sampling))
        self.runner.states_after(scheduled.state)
        self._count(scheduled)
        logits = self._for_sampler(logits)
        try:
            pending = self.sampler.launch(logits, sampling)
        except Exception:  # some row broke the batched launch: resolve first, then sample row by row
            log.warning("a batched sample launch failed; sampling this step row by row", exc_info=True)
            outputs = self._postprocess(*self.pipeline.resolve())
            return outputs + self._sample_now(scheduled, sampling, logits)
        outputs = self._postprocess(*self.pipeline.resolve())
        self.pipeline.launched(scheduled, sampling, pending)  # after resolve: drops rows that ended there
        return outputs

    def _run(self, scheduled: SchedulerOutput) -> Any:
        """Forward a step from host token ids, with its recurrent-state copies around it (hybrid
        models: prefix hits' snapshots into their slots before, new snapshots out after)."""
        self.runner.states_before(scheduled.state)
        logits = self.runner.run(scheduled.chunks)
        self.runner.states_after(scheduled.state)
        return logits

    def _for_sampler(self, logits: Any) -> Any:
        """The GPU sampler reads the logits where they are; the numpy one wants them on the host."""
        return logits if self.backend.name == "cuda" else self.backend.to_host(logits)

    def _postprocess(
        self, requests: list[Request], token_ids: list[int], logprobs: list[TokenLogprob | None] | None = None
    ) -> list[RequestOutput]:
        """Stop checks and outputs for sampled tokens (logprobs None: none were asked for). A
        request whose postprocessing fails (detokenizing, a stop check) ends alone, with its error."""
        outputs = []
        for i, (request, token_id) in enumerate(zip(requests, token_ids, strict=True)):
            logprob = logprobs[i] if logprobs is not None else None
            self.counters.generation_tokens += 1
            try:
                status = self.outputs.process(request, token_id, logprob)
                if status is None:
                    outputs.append(self.outputs.output(request))
                else:
                    self.scheduler.finish(request, status)
                    outputs.append(self._end(request))
            except Exception as exc:
                outputs.append(self._fail(request, exc, "postprocessing"))
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
        self.counters.cached_by_tier.update(request.cached_tokens_by_tier)
        log_finished(request)
        out = self.outputs.output(request)
        self._forget(request)
        return out

    def _fail(self, request: Request, error: Exception, stage: str) -> RequestOutput:
        """End one request whose own work failed: free its blocks and report the error to it
        alone. Built without the output processor, which may be what failed."""
        log.error("request %r failed in %s", request.request_id, stage, exc_info=error)
        self.scheduler.finish(request, RequestStatus.FINISHED_ERROR)
        self.counters.finished += 1
        self._forget(request)
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=[],
            new_text="",
            logprobs=None,
            finished=True,
            finish_reason=request.status.finish_reason,
            stop_reason=None,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            error=f"this request failed in {stage}: {type(error).__name__}: {error}",
        )

    def _live(self, request: Request) -> bool:
        return request.status == RequestStatus.RUNNING and self.scheduler.get(request.request_id) is request

    def _forget(self, request: Request) -> None:
        self.sampler.forget(request.request_id)
        self.outputs.forget(request.request_id)

    def persist_prefix_cache(self) -> int:
        """With a disk tier: move every cached prefix block no request uses down to it (the tree's
        through the host tier), so a restart finds them; return how many went to disk. At shutdown."""
        tiers = self.kv.tiers
        if tiers is None or tiers.disk is None:
            return 0
        before = tiers.stats.spilled_blocks["disk"]
        self.kv.reset_prefix_cache()
        tiers.flush_host_to_disk()
        return tiers.stats.spilled_blocks["disk"] - before

    # -- conveniences -----------------------------------------------------------------
    def generate(
        self,
        prompts: Iterable[list[int]],
        params: SamplingParams,
        images: Sequence[Sequence[ImageInput]] | None = None,
    ) -> list[dict[str, Any]]:
        """Run prompts to completion together; results in prompt order (tests, CLI, benchmarks).
        `images[i]`: prompt i's images, one per run of image tokens."""
        results: dict[str, dict[str, Any]] = {}
        order = []
        for i, ids in enumerate(prompts):
            rid = f"gen-{i}-{time.monotonic_ns()}"
            order.append(rid)
            results[rid] = {"prompt_token_ids": list(ids), "token_ids": [], "text": "", "logprobs": [],
                            "num_cached_tokens": 0}  # fmt: skip
            self.add_request(rid, list(ids), params, images=images[i] if images else ())
        while self.has_unfinished():
            for out in self.step():
                res = results[out.request_id]
                res["token_ids"].extend(out.new_token_ids)
                res["text"] += out.new_text
                res["logprobs"].extend(out.logprobs or [])
                res["num_cached_tokens"] = out.num_cached_tokens
                if out.finished:
                    res["finish_reason"] = out.finish_reason
                if out.error is not None:
                    res["error"] = out.error
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
            prefix_cache_hit_tokens_by_tier={tier: c.cached_by_tier[tier] for tier in ("device", "host", "disk")},
            kv_bytes_moved=kv_bytes_moved(self.kv.tiers),
            kv_evicted_blocks_total=self.kv.evicted_blocks,
            preemptions_total=self.scheduler.num_preemptions,
            expert_bytes_copied_total=self.expert_streaming.bytes_copied if self.expert_streaming else 0,
        )
