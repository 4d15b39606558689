"""Embedding and reranking models loaded beside the chat model (`paddock serve --embedding-model`,
`--rerank-model`): Qwen3-Embedding and Qwen3-Reranker are Qwen3 decoders, so each is a second
`LLMEngine` of its own, used only through `PromptRunner` (whole prompts, nothing sampled).

A task model's engine is sized for its job: one sequence at a time, a KV cache for one text of
`TASK_CONTEXT` tokens (or the model's context if shorter), no prefix cache, no CUDA graphs and no
float16 weight copies. Its calls come from the server's worker threads; a lock lets one run at
a time, so the engine is never driven by two threads at once.

`--embedding-model` also takes a BERT-family sentence-transformers folder (the default kind);
a GGUF file or a folder whose config.json names a decoder architecture is loaded here instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from app.engine.loader.names import CheckpointError, architecture_of
from app.engine.plan.job import CLASSIFIER_HEAD, pooling_module, read_json
from app.engine.plan.task_fit import TASK_CONTEXT, task_engine_config

_LAST_TOKEN = "pooling_mode_lasttoken"
T = TypeVar("T")


class TaskModel:
    """A decoder engine that one job uses: `run(fn)` calls `fn()` while no other call runs."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.engine.info.name

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            return fn()

    def generate(self, request_id: str, ids: list[int], params: Any, images: list[Any],
                 cancel: Callable[[], bool] | None, cancelled: Callable[[int], Exception]) -> list[int]:  # fmt: skip
        """One request's sampled ids, the engine stepped here (call inside `run`); `cancel()` is read
        between steps: the request is aborted and `cancelled(tokens so far)` raised."""
        self.engine.add_request(request_id, ids, params, images=images)
        reply: list[int] = []
        while self.engine.has_unfinished():
            if cancel is not None and cancel():
                self.engine.abort(request_id)
                raise cancelled(len(reply))
            for out in self.engine.step():
                if out.error is not None:
                    raise RuntimeError(f"{self.name}: {out.error}")
                reply.extend(out.new_token_ids)
        return reply

    @classmethod
    def load(
        cls, path: str | Path, job: str, device: str = "auto", context: int = TASK_CONTEXT,
        lora_adapter: str | Path | None = None,
    ) -> TaskModel:  # fmt: skip
        """The decoder at `path` (a .gguf file or a Hugging Face folder) for `job` ("embedding", "rerank",
        "ASR"), with a LoRA adapter folder merged into its weights if given (Granite Speech's).

        Errors name the path and what is wrong with it (FileNotFoundError, CheckpointError)."""
        from app.engine.core.engine import LLMEngine

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{job} model {path} does not exist")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise CheckpointError(f"{job} model {path}: not a .gguf file or a model folder")
        # the engine will-it-fit plans (plan/task_fit.py); an adapter is merged into the weights at load
        config = task_engine_config(str(path), device, context, lora_adapter)
        try:
            return cls(LLMEngine(config))
        except (ValueError, KeyError) as exc:  # CheckpointError included: say which job's model it was
            named = f"{job} model:" if str(path) in str(exc) else f"{job} model {path}:"
            raise CheckpointError(f"{named} {exc}") from None


def is_decoder_model(path: str | Path) -> bool:
    """A GGUF file, or a folder whose config.json names an architecture the engine decodes
    (anything else is left to the BERT embedder, whose errors name what it lacks)."""
    path = Path(path)
    if path.is_file():
        return path.suffix.lower() == ".gguf"
    config_file = path / "config.json"
    if not config_file.is_file():
        return False
    try:
        architecture_of(read_json(config_file))
    except CheckpointError:
        return False
    return True


def load_decoder_embedder(path: str | Path, device: str = "auto", context: int = TASK_CONTEXT) -> Any:
    """Qwen3-Embedding (or another decoder) as an `Embedder` beside the chat model: last-token
    pooling, the folder's own query prompt (config_sentence_transformers.json) if it has one."""
    from app.engine.tasks.pooling import DecoderEmbedder

    path = Path(path)
    prefix = _folder_query_prompt(path) if path.is_dir() else None
    task = TaskModel.load(path, "embedding", device, context)
    return DecoderEmbedder(task.engine, run_on_engine=task.run, query_prefix=prefix)


def load_decoder_reranker(path: str | Path, device: str = "auto", context: int = TASK_CONTEXT) -> Any:
    """Qwen3-Reranker as a `Reranker` beside the chat model: P("yes") against P("no") after the
    model card's prompt. A sentence-transformers embedding folder is refused: it pools, it does not judge."""
    from app.engine.tasks.pooling import decoder_reranker

    path = Path(path)
    if path.is_dir() and pooling_module(path) is not None:
        raise CheckpointError(
            f"rerank model {path}: this is an embedding model (modules.json has a Pooling module); "
            "pass it as --embedding-model, and a Qwen3-Reranker as --rerank-model"
        )
    task = TaskModel.load(path, "rerank", device, context)
    try:
        if CLASSIFIER_HEAD in task.engine.checkpoint.tensors:
            return _classifier_reranker(task, path)
        return decoder_reranker(task.engine, run_on_engine=task.run)
    except ValueError as exc:
        raise CheckpointError(f"rerank model {path}: {exc}") from None


def _classifier_reranker(task: TaskModel, path: Path) -> Any:
    """A Qwen3-Reranker GGUF as llama.cpp converts it: no output.weight (its own head's rows would be
    lost: the engine would fall back to the embeddings), the head's "yes" and "no" rows kept as
    `cls.output.weight` in the order `{arch}.classifier.output_labels` gives."""
    from app.engine.tasks.pooling import PromptRunner
    from app.engine.tasks.rerank import YesNoReranker

    engine = task.engine
    head = engine.checkpoint.tensors[CLASSIFIER_HEAD].dequantize()
    labels_key = f"{engine.checkpoint.architecture}.classifier.output_labels"
    labels = list(engine.checkpoint.metadata.get(labels_key) or [])
    if head.ndim != 2 or head.shape[1] != engine.model_config.hidden_size or sorted(labels) != ["no", "yes"]:
        raise CheckpointError(
            f"rerank model {path}: {CLASSIFIER_HEAD} of shape {list(head.shape)} with labels {labels} is not "
            f"a yes/no head over the hidden size {engine.model_config.hidden_size}"
        )
    runner, tokenizer = PromptRunner(engine), engine.tokenizer

    def final_logits(prompts: list[str]) -> tuple[np.ndarray, list[int]]:
        ids = [tokenizer.encode(p) for p in prompts]
        return task.run(lambda: runner.last_hidden(ids)) @ head.T, [len(i) for i in ids]

    return YesNoReranker(task.name, final_logits, labels.index("yes"), labels.index("no"))


def _folder_query_prompt(folder: Path) -> str | None:
    """Its sentence-transformers query prompt; refuses a pooling other than the last token's."""
    modes = pooling_module(folder)
    if modes is not None and not modes.get(_LAST_TOKEN):
        chosen = ", ".join(k for k, on in modes.items() if on and k.startswith("pooling_mode")) or "none"
        raise CheckpointError(
            f"embedding model {folder}: 1_Pooling pools by {chosen}; a decoder embeds with its last token "
            f"({_LAST_TOKEN})"
        )
    st_config = folder / "config_sentence_transformers.json"
    if not st_config.is_file():
        return None
    settings = read_json(st_config)
    prompts = settings.get("prompts", {}) if isinstance(settings, dict) else None
    if not isinstance(prompts, dict) or not isinstance(prompts.get("query", ""), str):
        wanted = '{"prompts": {"query": "..."}}'
        raise CheckpointError(f"{st_config}: expected {wanted}, found {settings!r:.80}")
    return prompts.get("query")
