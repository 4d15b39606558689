"""LLMEngine: add requests, step, abort. One step = schedule -> run -> sample -> postprocess.

With async decode on, a decode step is launched before the previous step's ids are read back,
and that step's host work runs while the GPU computes (core/pipeline.py)."""

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
from app.engine.core.audio import attach_audio
from app.engine.core.draft_model import DraftModelDrafter, check_same_tokenizer, draft_config
from app.engine.core.mtp_drafter import MtpDrafter
from app.engine.core.output_processor import OutputProcessor
from app.engine.core.pipeline import DecodePipeline
from app.engine.core.request_log import log_finished
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.core.step_cost import StepShape
from app.engine.core.step_pacing import StepPacer
from app.engine.core.vision import attach_vision, place_images
from app.engine.images import ImageInput
from app.engine.interface import ContextOverflowError, EngineStats, ModelInfo
from app.engine.loader.finite import check_finite
from app.engine.loader.lora import merge_lora, read_lora_adapter
from app.engine.loader.tokenizer import Tokenizer
from app.engine.loader.weights import open_checkpoint
from app.engine.models.mtp import MTP_ARCHITECTURES, MtpHead, mtp_tensors
from app.engine.models.registry import build_model, family, model_config
from app.engine.moe.residency import ExpertStreaming
from app.engine.plan.device import cpu_memory, device_memory
from app.engine.plan.engine_plan import experts_on_device, model_positions, resolve, weight_cache_mode
from app.engine.plan.shape import shape_of, with_mtp_kv
from app.engine.plan.tiers import offload_tiers
from app.engine.request import Request, RequestOutput, RequestStatus, TokenLogprob
from app.engine.sample.grammar import GrammarMasks
from app.engine.sample.sampler import Sampler, deferrable, may_verify
from app.engine.sampling_params import SamplingParams
from app.engine.spec.speculator import build_speculator
from app.engine.text.chat_template import chat_template_for
from app.engine.worker.decode_graphs import capture_if_room
from app.engine.worker.mtp_graph import MtpStepGraph
from app.engine.worker.prefill_graphs import capture_prefill_graphs
from app.engine.worker.runner import ModelRunner, allocate_caches, attention_caches
from app.engine.worker.verify_graphs import capture_verify_graphs

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
        self.log_requests = True  # a draft model's engine (core/draft_model.py) logs none
        started = time.monotonic()
        self._open_checkpoint()
        self._load_model()
        self._allocate_kv()
        self._build_request_path()
        log.info("loaded %s (%s, %s) on %s in %.1f s; prefix cache %s", self.info.name, self.model_config.architecture,
                 self.info.quantization, self.backend.name, time.monotonic() - started,
                 "on" if config.enable_prefix_caching else "off")  # fmt: skip
        log.info("%s", self.plan.describe())

    # -- loading, in the order it happens -------------------------------------------------
    def _open_checkpoint(self) -> None:
        """The checkpoint, checked; its config, shape, tokenizer and chat template."""
        self.path = resolve_model_path(self.config.model)
        self.checkpoint = open_checkpoint(self.path)
        check_finite(self.checkpoint.tensors, self.path)  # a NaN scale would make every logit NaN
        if self.config.lora_adapter:
            adapter = read_lora_adapter(Path(self.config.lora_adapter), self.checkpoint.architecture)
            self.checkpoint = merge_lora(self.checkpoint, adapter)
        self.model_config = model_config(self.checkpoint)
        self.shape = shape_of(self.checkpoint, self.model_config)
        if self.config.speculative == "mtp":  # the head's K/V: one more attention layer's in every block
            self.shape = with_mtp_kv(self.shape)
        if self.checkpoint.format == "gguf":
            self.tokenizer = Tokenizer.from_gguf_metadata(self.checkpoint.metadata)
            template_source: Any = self.checkpoint.metadata
        else:
            self.tokenizer = Tokenizer.from_pretrained_dir(self.checkpoint.tokenizer_dir or self.path)
            template_source = self.checkpoint.tokenizer_dir or self.path
        self.chat_template = chat_template_for(template_source, self.tokenizer, self.model_config.architecture)

    def _load_model(self) -> None:
        """The backend and the weights on it; then the plan, which sizes the KV cache from what is left."""
        config = self.config
        device = cpu_memory() if config.device == "cpu" else device_memory()  # read once, before the weights
        self.device_memory = device  # the reading the plan (and `paddock fit` given it) counts from
        self.backend = select_backend(config.device, weight_cache_mode(config, self.shape, device),
                                      config.cpu_kernels, config.threads)  # fmt: skip
        experts = experts_on_device(config, self.shape, self.backend.name, device)
        self.expert_streaming = None if experts is None else ExpertStreaming(on_gpu=experts)
        if self.expert_streaming is not None:
            self.backend.expert_streaming = self.expert_streaming
        positions = model_positions(config, self.shape)
        self.model = build_model(self.checkpoint, self.backend, positions, self.model_config)
        free = self.backend.free_memory() if self.backend.name == "cuda" else None
        self.plan = resolve(config, self.shape, device, self.backend.name, free, self.model.syncs_host)
        self.block_size = self.plan.block_size
        self.max_model_len = self.plan.max_model_len
        self.kv_dtype = self.plan.kv_dtype

    def _allocate_kv(self) -> None:
        """The KV cache (and a hybrid model's recurrent-state rows), the runner over it (with its CUDA
        graphs), the vision tower and the cache manager."""
        plan, cfg = self.plan, self.model_config
        state, spec = None, self.config.speculative != "off"
        if plan.state_slots:  # speculative decoding: a checkpoint row per slot to roll verify steps back to
            state = StateCache(plan.state_slots, plan.state_snapshots, plan.block_size, plan.state_snapshot_interval,
                               host_rows=plan.state_host_rows, checkpoints=spec)  # fmt: skip
        state_rows = state.num_rows if state is not None else 0
        kv_caches = allocate_caches(self.backend, cfg, plan.num_blocks, plan.block_size, plan.kv_dtype, state_rows)
        self.runner = ModelRunner(self.model, self.backend, kv_caches, plan.block_size)
        self.vision = attach_vision(self.runner, self.checkpoint, self.tokenizer, self.config.mmproj)
        self.audio = attach_audio(self.runner, self.checkpoint, self.tokenizer, self.config.mmproj)
        if plan.graphs:
            from app.engine.worker.decode_graphs import DecodeGraphs

            self.runner.graphs = DecodeGraphs(self.model, self.backend, kv_caches, plan.block_size,
                                              plan.max_model_len, self.config.max_num_seqs)  # fmt: skip
            self.runner.graphs.capture()
            self.runner.prefill_graphs = capture_prefill_graphs(
                plan.prefill_graphs, self.model, self.backend, kv_caches, plan.block_size,
                plan.max_model_len, self.runner.graphs.capture_stream,
            )  # fmt: skip
            if spec:  # verify steps of up to speculative_max_batch sequences (worker/verify_graphs.py)
                self.runner.verify_graphs = capture_verify_graphs(
                    self.model, self.backend, kv_caches, plan.block_size, plan.max_model_len,
                    min(self.config.speculative_max_batch, self.config.max_num_seqs), self.config.num_draft_tokens,
                    self.runner.graphs.capture_stream, keep_hidden=self.config.speculative == "mtp",
                )  # fmt: skip
        tiers = None
        if cfg.is_hybrid and (plan.kv_host_gb or plan.kv_disk_gb):
            log.info("KV host/disk tiers off for this hybrid model (a prefix hit needs its recurrent state too); "
                     "host RAM keeps evicted state snapshots instead")  # fmt: skip
        elif cfg.attention_layers:
            copier = DeviceBlocks(self.backend, attention_caches(cfg, kv_caches))
            tiers = offload_tiers(plan, copier, self.path, self.shape, self.config.kv_disk_dir)
        if state is not None:
            self.runner.allocate_host_states(plan.state_host_rows)
            log.info("recurrent state: %d slots and %d prefix-cache snapshots of %.1f MiB each (%.1f MiB)%s",
                     plan.state_slots, plan.state_snapshots, cfg.state_bytes_per_sequence / 2**20,
                     plan.state_bytes / 2**20, ", and a speculative checkpoint per slot" if spec else "")  # fmt: skip
        self.kv = KVCacheManager(plan.num_blocks, plan.block_size, enable_prefix_caching=self.config.enable_prefix_caching,
                                 tiers=tiers, state=state)  # fmt: skip

    def _load_draft_model(self) -> DraftModelDrafter:
        """`--draft-model` in an engine of its own (core/draft_model.py); refused unless its tokenizer is
        this model's."""
        draft = LLMEngine(draft_config(self.config, self.plan.max_model_len))
        draft.log_requests = False  # one request per proposal: the target's request line reports the drafts
        check_same_tokenizer(self.tokenizer, draft.tokenizer, str(self.path), str(draft.path))
        log.info("draft model %s (%s) for speculative decoding", draft.info.name, draft.model_config.architecture)
        return DraftModelDrafter(draft, self.model_config.vocab_size)

    def _load_mtp_head(self) -> MtpDrafter:
        """The model's multi-token-prediction head (models/mtp.py) over one more paged KV array; refused
        for a model without one."""
        cfg = self.model_config
        tensors = None
        if self.checkpoint.architecture in MTP_ARCHITECTURES:
            tensors = mtp_tensors(self.checkpoint, cfg, family(self.checkpoint.architecture))
        if tensors is None:
            raise ValueError(f"speculative mtp needs a model with a multi-token-prediction head (Qwen3.5, "
                             f"Qwen3-Next, Nemotron-H MoE: mtp.* tensors, or a GGUF's nextn block); {self.path} "
                             f"({cfg.architecture}) has none")  # fmt: skip
        head = MtpHead(self.backend, self.model, tensors)
        layer = cfg.attention_layers[0]
        cache = self.backend.alloc_kv_cache(self.plan.num_blocks, self.plan.block_size, *cfg.kv_shape(layer),
                                            self.plan.kv_dtype)  # fmt: skip
        self.runner.keep_hidden = True
        log.info("MTP head of %s for speculative decoding", self.path.name)
        drafter = MtpDrafter(head, self.runner, cache, cfg.vocab_size, self.config.max_num_batched_tokens)
        if self.runner.graphs is not None:  # its chained draft steps as a graph (worker/mtp_graph.py)
            step = MtpStepGraph(head, self.backend, cache, self.plan.block_size, self.plan.max_model_len, cfg.hidden_size)
            drafter.step_graph = capture_if_room(step, self.runner.graphs.capture_stream, "MTP draft steps")
        return drafter

    def _build_request_path(self) -> None:
        """Scheduler, sampler, output processing and the look-ahead pipeline; what the API reports."""
        config, plan, cfg = self.config, self.plan, self.model_config
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=plan.max_model_len,
                block_size=plan.block_size,
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
        self.outputs = OutputProcessor(self.tokenizer, plan.max_model_len)
        drafter: Any = None
        if config.speculative == "draft":
            drafter = self._load_draft_model()
        elif config.speculative == "mtp":
            drafter = self._load_mtp_head()
        self.mtp = drafter if config.speculative == "mtp" else None
        self.speculator = build_speculator(config.speculative, config.num_draft_tokens,
                                           config.speculative_max_batch, may_verify, drafter)  # fmt: skip
        self.pipeline = DecodePipeline(self.scheduler, self.runner.decodes_from_device)
        # prefill paced while requests decode (core/step_pacing.py); the shape of the step in flight, timed
        # when its ids are read back
        factor, floor = config.decode_latency_factor, self.scheduler.config.min_paced_chunk
        self.pacer = StepPacer(factor, floor=floor, max_chunk=self.runner.split_max_chunk()) if factor else None
        self._flight_shape: StepShape | None = None
        self.async_decode = plan.async_decode and self.mtp is None  # the MTP head reads every step's hidden states
        self.counters = _Counters()
        self.info = ModelInfo(
            name=config.served_model_name or self.path.stem,
            path=str(self.path),
            architecture=cfg.architecture,
            quantization=self.checkpoint.quantization,
            parameters=self.checkpoint.parameter_count,
            context_length=plan.max_model_len,
            device=self.backend.name,
            supports_vision=self.vision is not None,
            supports_audio=self.audio is not None,
            quant_mix=self.checkpoint.quant_mix,
        )

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
        placed = place_images(self.vision, prompt_token_ids, images, self.audio)
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
        """One step: schedule -> run -> sample -> postprocess, for sync and look-ahead decode alike. With
        async decode a step may stay in flight (its ids not read back); the next one is then a look-ahead,
        launched from those ids on the device before the step in flight is resolved, or, where that is
        not safe, the step in flight is resolved first and this one runs from the host's ids."""
        ahead = self.pipeline.can_look_ahead()  # False with nothing in flight
        outputs = self._resolve() if self.pipeline.in_flight is not None and not ahead else []
        if self.speculator is not None and self.pipeline.in_flight is None:
            self.speculator.propose(self.scheduler.running, self.max_model_len)
        scheduled = self.scheduler.schedule(self.pacer.limit() if self.pacer is not None else None)
        outputs += [self._end(request) for request in scheduled.finished]  # outgrew the whole KV cache
        if not scheduled.chunks:
            return outputs
        sampling = self.pipeline.planned(scheduled) if ahead else [c.request for c in scheduled.chunks if c.samples]
        logits = self._run(scheduled, sampling, ahead)
        if not sampling:
            self.scheduler.update(scheduled, {})
            if self.pacer is not None:
                self.pacer.step_unsampled()
            return outputs
        logits = self._for_sampler(logits)
        if any(c.draft_token_ids for c in scheduled.chunks):
            return outputs + self._verify(scheduled, logits)
        defer = ahead or (self.async_decode and all(deferrable(r) for r in sampling) and not self._drafting())
        pending = self._launch(logits, sampling) if defer else None
        if ahead:  # the step in flight's host work, while this one runs
            outputs += self._resolve()
        if pending is None:
            return outputs + self._sample_now(scheduled, sampling, logits)
        self.pipeline.launched(scheduled, sampling, pending)  # after resolve: drops rows that ended there
        self._flight_shape = StepShape.of(scheduled)
        return outputs

    def _run(self, scheduled: SchedulerOutput, sampling: list[Request], ahead: bool) -> Any:
        """The model over the scheduled chunks: a look-ahead's input ids are the in-flight step's, on the device.
        Hybrid models: prefix hits' state snapshots go into their slots before, new snapshots out after."""
        self.runner.states_before(scheduled.state)
        if ahead:
            logits = self.runner.run_from_device(scheduled.chunks, *self.pipeline.inputs(sampling))
        else:
            logits = self.runner.run(scheduled.chunks)
        self.runner.states_after(scheduled.state)
        if self.mtp is not None and self.speculator is not None:
            self.mtp.observe(scheduled.chunks, self.runner.step_hidden, self.speculator.may_draft)
        self._count(scheduled)
        return logits

    def _launch(self, logits: Any, sampling: list[Request]) -> Any:
        """The batched sample launched without waiting for its ids; None where some row broke the launch
        (the step is then sampled now, row by row)."""
        try:
            return self.sampler.launch(logits, sampling)
        except Exception:
            log.warning("a batched sample launch failed; sampling this step row by row", exc_info=True)
            return None

    def _resolve(self) -> list[RequestOutput]:
        """Wait for the step in flight's ids and postprocess them."""
        requests, token_ids = self.pipeline.resolve()
        self._timed(self._flight_shape)
        self._flight_shape = None
        return self._postprocess(requests, token_ids)

    def _timed(self, shape: StepShape | None) -> None:
        """A step's sampled ids were just read back: the pacer takes its time (core/step_pacing.py)."""
        if self.pacer is not None and shape is not None:
            self.pacer.step_done(shape)

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
        self._timed(StepShape.of(scheduled))
        rows = [row for row in rows if self._live(row[0])]  # a look-ahead's rows may have ended meanwhile
        self.scheduler.update(scheduled, {request.request_id: token for request, token, _ in rows})
        requests, token_ids = [row[0] for row in rows], [row[1] for row in rows]
        return failed + self._postprocess(requests, token_ids, [row[2] for row in rows])

    def _drafting(self) -> bool:
        """Whether the next step may draft: then this one is sampled now (drafts need its token)."""
        return self.speculator is not None and self.speculator.active(self.scheduler.running)

    def _verify(self, scheduled: SchedulerOutput, logits: Any) -> list[RequestOutput]:
        """Sample a step with verify chunks: each of a verify chunk's k+1 rows with the ordinary
        sampler, then keep the drafts its samples agree with (spec/verify.py). If the batch's sample
        fails, the step's requests fail (verify rows are never deferred or retried alone)."""
        assert self.speculator is not None
        chunks = [c for c in scheduled.chunks if c.samples]
        rows = [c.request for c in chunks for _ in range(c.num_sampled_rows)]
        try:
            result = self.sampler.sample(logits, rows)
        except Exception as exc:
            return [self._fail(c.request, exc, "sampling") for c in chunks if self._live(c.request)]
        self._timed(StepShape.of(scheduled))
        sampled: dict[str, int | list[int]] = {}
        rows_out: list[tuple[Request, bool, list[int], list[TokenLogprob | None]]] = []
        at = 0
        for chunk in chunks:
            n, request = chunk.num_sampled_rows, chunk.request
            tokens, logprobs = result.token_ids[at : at + n], result.logprobs[at : at + n]
            at += n
            if not self._live(request):
                continue
            if chunk.draft_token_ids:
                tokens = self.speculator.verify(request, chunk.draft_token_ids, tokens)
                sampled[request.request_id] = tokens
            else:
                sampled[request.request_id] = tokens[0]
            rows_out.append((request, bool(chunk.draft_token_ids), tokens, logprobs))
        self.scheduler.update(scheduled, sampled)
        plain = [(r, t[0], lp[0]) for r, verified, t, lp in rows_out if not verified]
        outputs = self._postprocess([p[0] for p in plain], [p[1] for p in plain], [p[2] for p in plain])
        return outputs + [self._emit(r, t, lp) for r, verified, t, lp in rows_out if verified]

    def _emit(self, request: Request, tokens: list[int], logprobs: list[TokenLogprob | None]) -> RequestOutput:
        """A verify step's tokens, appended and stop-checked one by one; at a stop the rest are dropped
        and the request's computed tokens cut to what it kept (the prefix cache takes only those)."""
        try:
            for token, logprob in zip(tokens, logprobs, strict=False):
                request.output_token_ids.append(token)
                self.counters.generation_tokens += 1
                status = self.outputs.process(request, token, logprob)
                if status is not None:
                    request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
                    self.scheduler.finish(request, status)
                    return self._end(request)
            return self.outputs.output(request)
        except Exception as exc:
            return self._fail(request, exc, "postprocessing")

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
        if self.log_requests:
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
        if self.speculator is not None:
            self.speculator.forget(request.request_id)
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

    def stop_background_work(self) -> None:
        """Stop what runs beside the steps: the host tiers' pinning threads (cache/host_chunks.py), which
        would otherwise finish pinning a tier whose engine is gone, and the disk tier's I/O threads. At
        shutdown, after persist_prefix_cache."""
        tiers = self.kv.tiers
        if tiers is not None and tiers.host is not None:
            tiers.host.close()
        if tiers is not None and tiers.disk is not None:
            tiers.disk.close()
        if self.runner.host_states is not None:
            self.runner.host_states.chunks.close()

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
            spec_draft_tokens_total=self.speculator.drafted if self.speculator else 0,
            spec_accepted_tokens_total=self.speculator.accepted if self.speculator else 0,
        )
