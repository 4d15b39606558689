"""The local model the Studio runs: load, unload and switch it off the caller's thread, and say what is loaded.

`EngineHost` owns at most one `EngineClient`. Loading takes seconds (weights read, KV
cache allocated), so `load` and `unload` run on the host's own single worker thread:
one model change at a time, in the order asked, never on the UI thread. Every status
change ("loading", "ready", "unloading", "empty", "error") goes to the listeners on
that worker thread; a UI moves them onto its own thread (app/ui/workers.py does).

Switching is transactional: the new model's files are checked first (model_check.py: a
truncated or corrupt file is refused before anything is unloaded), then it is loaded
while the old one keeps serving, and only then is the old one released. On the GPU the
old model is released before the new one loads (two models side by side would need the
memory will-it-fit counted once, and the new engine sizes its KV cache from what is
free); if the new one then fails, the old one is loaded again. Either way a failed
switch leaves the old model loaded, with the failure in `RuntimeStatus.problem`.
Listeners hear "unloading" before an engine closes, so whoever streams from it (the
chat, the API server) can stop cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from app.studio.tasks import DoneCallback, SyncExecutor, TaskContext, TaskHandle, ThreadExecutor

if TYPE_CHECKING:
    from app.engine import EngineClient, EngineConfig, ModelInfo
    from app.engine.plan.fit import FitOptions
    from app.studio.settings import Settings

EMPTY, LOADING, READY, UNLOADING, ERROR = "empty", "loading", "ready", "unloading", "error"

EngineFactory = Callable[["EngineConfig"], "EngineClient"]
StatusListener = Callable[["RuntimeStatus"], None]


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is meant for the user."""


@dataclass(frozen=True)
class RuntimeStatus:
    """What the status bar shows: the state, and what is loaded when something is."""

    state: str  # EMPTY | LOADING | READY | UNLOADING | ERROR
    message: str = ""  # a sentence for the user: what is happening, or what went wrong
    model: str = ""
    path: str = ""
    architecture: str = ""
    quantization: str = ""
    parameters: int | None = None
    context_length: int | None = None
    device: str = ""
    problem: str = ""  # a switch that failed while this model stayed loaded: the sentence to show
    base: bool = False  # a base model (no chat template of its own): the chat says so

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def busy(self) -> bool:
        return self.state in (LOADING, UNLOADING)

    @classmethod
    def from_model(cls, info: ModelInfo) -> RuntimeStatus:
        """The status of a loaded model (its header read again for the base-model mark: milliseconds)."""
        from app.studio.library import is_base_model

        return cls(READY, f"{info.name} is ready", info.name, info.path, info.architecture, info.quantization,
                   info.parameters, info.context_length, info.device, base=is_base_model(info.path))


@dataclass(frozen=True)
class MemoryUse:
    """Memory the Studio holds now: the whole process (weights and KV on the CPU) and the GPU's share."""

    process_bytes: int | None  # resident set of this process; None where it cannot be read
    device_bytes: int | None  # the engine's GPU memory; None on the CPU
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0

    def describe(self) -> str:
        from app.engine.plan.fit import format_bytes

        parts = []
        if self.device_bytes:
            parts.append(f"GPU {format_bytes(self.device_bytes)}")
        if self.process_bytes is not None:
            parts.append(f"RAM {format_bytes(self.process_bytes)}")
        if self.kv_blocks_total:
            parts.append(f"KV {100 * self.kv_blocks_used / self.kv_blocks_total:.0f}%")
        return " · ".join(parts) or "memory unknown"


def default_factory(config: EngineConfig) -> EngineClient:
    from app.engine import AsyncEngine

    return AsyncEngine(config)


class EngineHost:
    """Holds the loaded model. `load`/`unload` return at once; the work happens on the host's thread."""

    def __init__(self, factory: EngineFactory = default_factory,
                 executor: ThreadExecutor | SyncExecutor | None = None) -> None:
        self._factory = factory
        self._executor = executor or ThreadExecutor(max_workers=1)  # one worker: changes run in order
        self._lock = threading.Lock()
        self._client: EngineClient | None = None
        self._config: EngineConfig | None = None  # what the loaded client was made from (None: adopted)
        self._status = RuntimeStatus(EMPTY, "No model loaded")
        self._listeners: list[StatusListener] = []

    @property
    def client(self) -> EngineClient | None:
        with self._lock:
            return self._client

    @property
    def status(self) -> RuntimeStatus:
        with self._lock:
            return self._status

    def subscribe(self, listener: StatusListener) -> Callable[[], None]:
        """Call `listener(status)` after each change (on the host's thread); returns an unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)
        return lambda: self._unsubscribe(listener)

    def load(self, config: EngineConfig, on_done: DoneCallback | None = None) -> TaskHandle[RuntimeStatus]:
        """Load `config.model` (unloading what is loaded first). The result carries the status or the error."""
        return self._executor.submit(lambda ctx: self._load(config, ctx), on_done=on_done)

    def unload(self, on_done: DoneCallback | None = None) -> TaskHandle[RuntimeStatus]:
        return self._executor.submit(lambda ctx: self._unload(), on_done=on_done)

    def adopt(self, client: EngineClient) -> None:
        """Take an engine that is already loaded (tests, a caller that built one itself)."""
        with self._lock:
            old, self._client, self._config = self._client, client, None
        if old is not None and old is not client:
            _close(old)
        self._set(RuntimeStatus.from_model(client.model))

    def memory(self) -> MemoryUse:
        """A cheap snapshot (no engine call blocks): safe to poll from a UI timer."""
        client = self.client
        stats = None
        if client is not None:
            try:
                stats = client.stats()
            except Exception:  # a fake or a closing engine: memory is still worth showing
                stats = None
        return MemoryUse(
            process_bytes=process_memory(),
            device_bytes=(stats.device_memory_used_bytes or None) if stats is not None else None,
            kv_blocks_used=stats.kv_blocks_used if stats is not None else 0,
            kv_blocks_total=stats.kv_blocks_total if stats is not None else 0,
        )

    def shutdown(self) -> None:
        """Close the engine now, on the caller's thread (application exit)."""
        with self._lock:
            old, self._client = self._client, None
        if old is not None:
            _close(old)
        self._executor.shutdown()

    # -- on the host's thread ------------------------------------------------------------
    def _load(self, config: EngineConfig, ctx: TaskContext) -> RuntimeStatus:
        from app.studio.model_check import check_model_path

        label = model_label(config.model)
        old, old_config, old_status = self.client, self._config, self.status
        self._set(RuntimeStatus(LOADING, f"Loading {label}…", model=label))
        problem = check_model_path(config.model) if config.model != "default" else None
        if problem is not None:
            return self._failed(label, ValueError(problem.message), old, old_status)
        ctx.token.raise_if_cancelled()
        if old is not None and _on_gpu(old):  # free the GPU first; restored below if the new one fails
            self._unload(next_state=RuntimeStatus(LOADING, f"Loading {label}…", model=label))
            old = None
        try:
            client = self._factory(config)
        except Exception as exc:  # every failure becomes a sentence in the window
            if old is None and old_config is not None and old_status.ready:
                old = self._reload(old_config)
            return self._failed(label, exc, old, old_status)
        if old is not None:  # listeners stop streaming from the old engine before it closes
            self._set(RuntimeStatus(UNLOADING, f"Switching to {label}…", model=old.model.name))
        with self._lock:
            self._client, self._config = client, config
        if old is not None:
            _close(old)
        status = RuntimeStatus.from_model(client.model)
        self._set(status)
        return status

    def _failed(self, label: str, exc: BaseException, kept: EngineClient | None,
                kept_status: RuntimeStatus) -> NoReturn:
        """Report a failed load; `kept` (if any) is still loaded and stays so."""
        message = load_error_message(label, exc)
        if kept is not None:
            base = kept_status if kept_status.ready else RuntimeStatus.from_model(kept.model)
            self._set(dataclasses.replace(base, message=f"{message} {base.model} is still loaded.",
                                          problem=message))
        else:
            self._set(RuntimeStatus(ERROR, message, model=label))
        raise ModelLoadError(message) from exc

    def _reload(self, config: EngineConfig) -> EngineClient | None:
        """The model that was released to make room, loaded again; None if even that fails."""
        try:
            client = self._factory(config)
        except Exception:
            return None
        with self._lock:
            self._client, self._config = client, config
        return client

    def _unload(self, next_state: RuntimeStatus | None = None) -> RuntimeStatus:
        old = self.client
        if old is not None:
            self._set(RuntimeStatus(UNLOADING, f"Unloading {old.model.name}…", model=old.model.name))
            with self._lock:
                self._client, self._config = None, None
            _close(old)
        status = next_state or RuntimeStatus(EMPTY, "No model loaded")
        self._set(status)
        return status

    def _set(self, status: RuntimeStatus) -> None:
        with self._lock:
            self._status = status
            listeners = list(self._listeners)
        for listener in listeners:
            listener(status)

    def _unsubscribe(self, listener: StatusListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


def engine_config(settings: Settings, model: str | None = None, models_dir: str | os.PathLike[str] | None = None,
                  ) -> EngineConfig:
    """The engine configuration the Studio's settings describe, for `model` (default: the start-up model).

    A model name is looked up in the models folder; a path or "default" is used as it is.
    """
    from app.engine import EngineConfig

    name = model or settings.get("models.default") or "default"
    if name != "default" and not Path(name).expanduser().exists() and models_dir is not None:
        from app.studio.library import ModelLibrary

        with contextlib.suppress(KeyError):  # not there: the engine's own "not found" message names it
            name = str(ModelLibrary(models_dir).find(name).path)
    return EngineConfig(
        model=name,
        device=settings.get("engine.device"),
        max_model_len=settings.get("engine.context_length") or None,
        kv_dtype=settings.get("engine.kv_dtype"),
        enable_prefix_caching=settings.get("engine.prefix_cache"),
        gpu_memory_utilization=settings.get("engine.gpu_memory_utilization"),
        max_num_seqs=settings.get("engine.max_num_seqs"),
    )


def fit_options(settings: Settings) -> FitOptions:
    """Will-it-fit asked with the engine settings the model would be loaded with."""
    from app.engine.plan.fit import FitOptions

    return FitOptions(
        context_length=settings.get("engine.context_length") or None,
        kv_dtype=settings.get("engine.kv_dtype"),
        max_num_seqs=settings.get("engine.max_num_seqs"),
        gpu_memory_utilization=settings.get("engine.gpu_memory_utilization"),
    )


def task_models_beside(settings: Settings) -> tuple:  # -> tuple[BesideModel, ...]
    """The task models the Studio loads beside the chat model, for its will-it-fit, each a second engine: the
    Documents pane's embedding model when it is a decoder (Qwen3-Embedding), and the Transcribe pane's model
    when it is a speech LLM (Qwen3-ASR, Granite Speech, Gemma 4 with audio). The built-in MiniLM, a
    sentence-transformers BERT folder and Whisper (faster-whisper) run outside the engine's plan. Read on a
    worker (headers)."""
    from app.engine.plan.fit import TRANSCRIPTION, BesideModel, shape_from_checkpoint
    from app.engine.tasks.speech_llm import is_speech_llm_folder
    from app.engine.tasks.task_model import is_decoder_model

    wanted = ((settings.get("documents.embedding_model"), "embeddings", is_decoder_model),
              (settings.get("transcribe.model"), TRANSCRIPTION, is_speech_llm_folder))  # fmt: skip
    return tuple(BesideModel(Path(path).name, job, shape_from_checkpoint(path))
                 for path, job, on_engine in wanted if path and Path(path).exists() and on_engine(path))  # fmt: skip


def _on_gpu(client: EngineClient) -> bool:
    return str(client.model.device).startswith("cuda")


def model_label(model: str) -> str:
    """A short name for a model argument: the embedded default, or the file or folder name."""
    if model == "default":
        return "Gemma 3 270M (embedded)"
    return Path(model).name or model


def load_error_message(label: str, exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"Could not load {label}: the model file was not found ({exc})."
    if isinstance(exc, MemoryError):
        return f"Could not load {label}: not enough memory. Pick a smaller model or a shorter context."
    detail = str(exc) or type(exc).__name__
    return f"Could not load {label}: {detail}"


def process_memory() -> int | None:
    """Resident memory of this process in bytes (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB
    except (ImportError, OSError):
        return None


_closing: set[asyncio.Future[Any]] = set()


def _close(client: Any) -> None:
    """Stop an engine: AsyncEngine has a blocking close(); other clients only the shutdown coroutine."""
    close = getattr(client, "close", None)
    if callable(close):
        close()
        return
    shutdown = getattr(client, "shutdown", None)
    if not callable(shutdown):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the host's thread: no loop of its own
        asyncio.run(shutdown())
        return
    task = asyncio.ensure_future(shutdown())  # called from a running loop (adopt on the UI thread)
    _closing.add(task)  # a reference, so the task is not collected before it ends
    task.add_done_callback(_closing.discard)
