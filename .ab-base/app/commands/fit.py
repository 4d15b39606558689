"""`paddock fit MODEL`: will the model fit in GPU memory (or CPU RAM), and at what context?

MODEL is a .gguf file, a model folder, a name in the models folder, "default" (the
embedded model), or a Hugging Face repo id (`owner/name`), which is checked before
download from its config.json or the GGUF header (read with an HTTP range request).

`--embedding-model`, `--rerank-model` and `--asr-model` (as `paddock serve` takes them) add the task models
loaded beside it, each planned as its engine runs it (plan/task_fit.py), a speech model with its audio tower.
A MODEL that is itself an embedder, a reranker or a speech model is planned that way too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

TASK_FLAGS = (("embedding-model", "embeddings"), ("rerank-model", "reranking"), ("asr-model", "transcription"))
HELP = "predict whether a model fits in GPU memory, with the breakdown and the largest context that fits"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .gguf file, a model folder, a library name, 'default' or owner/repo")
    parser.add_argument("--ctx", type=int, default=None, help="context length (default: the model's own)")
    parser.add_argument("--batch", type=int, default=1, help="sequences holding a full context at once")
    parser.add_argument("--kv-dtype", default="auto", help="auto, float16 (f16), fp8 or float32 (f32)")
    parser.add_argument("--max-num-seqs", type=int, default=32, help="requests decoded together")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per engine step")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                        help="share of free memory the engine may take")
    parser.add_argument("--experts-on-gpu", default=None,
                        help="mixture of experts: experts per layer kept on the GPU (N, auto or all); "
                        "the rest stay in host RAM")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="the device to predict for (auto: the GPU if one is usable, else the CPU's RAM)")
    parser.add_argument("--prefix-cache", choices=["on", "off"], default="on",
                        help="hybrid models: with prefix caching, recurrent-state snapshots are counted too")
    parser.add_argument("--state-snapshot-gb", type=float, default=None, metavar="GB",
                        help="hybrid models: memory for recurrent-state snapshots (default: the engine's rule)")
    parser.add_argument("--file", default=None, help="for a hub repo with several GGUF files: which one")
    for flag, job in TASK_FLAGS:
        parser.add_argument(f"--{flag}", action="append", default=[], metavar="PATH",
                            help=f"a local {job} model loaded beside it (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from app.engine.plan.fit import FitOptions, check_fit, format_bytes, is_task_job, task_fit_options

    try:
        options = FitOptions(
            context_length=args.ctx, batch=args.batch, kv_dtype=args.kv_dtype, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            gpu_memory_utilization=args.gpu_memory_utilization, experts_on_gpu=args.experts_on_gpu,
            enable_prefix_caching=args.prefix_cache == "on", state_snapshot_gb=args.state_snapshot_gb,
        )
        label, shape, job = resolve_shape(args.model, args.file)
        if is_task_job(job):  # planned as the engine runs a task model, not with the chat settings
            options = task_fit_options(shape, job)
        beside = beside_models(args)
        device = target_device(args.device)
    except Exception as exc:  # every failure is a one-line message, never a traceback
        print(f"paddock fit: {exc}", file=sys.stderr)
        return 2
    try:
        report = check_fit(shape, options, device, beside)
    except ValueError as exc:  # --experts-on-gpu that the model cannot take
        print(f"paddock fit: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": label, "job": job, "shape": dataclasses.asdict(shape), **report.as_dict()},
                         indent=2))
    else:
        layers = f"{shape.num_layers} layers"
        if shape.kv_layers:  # a hybrid model's attention layers, or layers that share or size their KV
            layers += f", {len(shape.kv_layers)} with a KV cache"
        if shape.state_bytes_per_sequence:
            layers += f", {format_bytes(shape.state_bytes_per_sequence)} of recurrent state per sequence"
        does = f"; {job}" if job else ""
        print(f"Model: {label} ({shape.architecture}, {layers}, {shape.num_kv_heads} KV heads x {shape.head_dim}"
              f"{does})")
        print(report.summary())
    return 0


def beside_models(args: argparse.Namespace) -> tuple:  # -> tuple[BesideModel, ...]
    """The task models the flags name, each read as `paddock fit` reads MODEL (its audio tower included)."""
    from pathlib import Path

    from app.engine.plan.fit import BesideModel, shape_from_checkpoint

    models = []
    for flag, job in TASK_FLAGS:
        for path in getattr(args, flag.replace("-", "_")):
            if not Path(path).expanduser().exists():
                raise ValueError(f"--{flag} {path}: no such file or folder")
            models.append(BesideModel(Path(path).name, job, shape_from_checkpoint(Path(path).expanduser())))
    return tuple(models)


def target_device(name: str):  # -> DeviceMemory
    """The device `--device` names, with its free memory now."""
    from app.engine.plan.fit import cpu_memory, device_memory

    device = cpu_memory() if name == "cpu" else device_memory()
    if name == "cuda" and device.kind != "cuda":
        raise ValueError("--device cuda: no usable GPU (CuPy cannot reach one)")
    return device


def resolve_shape(model: str, gguf_file: str | None = None):  # -> tuple[str, ModelShape, str | None]
    """Find MODEL locally (path, 'default', library name) or on the hub, and read its shape and what it does
    (plan/job.py; None for a hub folder, whose files are not read)."""
    from pathlib import Path

    from app.engine.plan.fit import shape_from_checkpoint
    from app.engine.plan.job import model_job

    if model == "default":
        from app.engine.loader.embedded import embedded_gguf_path

        path = embedded_gguf_path()
        return path.name, shape_from_checkpoint(path), model_job(path)
    path = Path(model).expanduser()
    if path.exists():
        return str(path), shape_from_checkpoint(path), model_job(path)

    from app.commands.models import hub_client, models_dir
    from app.studio.library import ModelLibrary

    folder = models_dir()
    try:
        entry = ModelLibrary(folder).find(model)
        return entry.name, shape_from_checkpoint(entry.path), entry.job
    except KeyError:
        pass
    if model.count("/") != 1:
        raise ValueError(f"{model!r} is not a file, a model in {folder}, or a Hugging Face repo id (owner/name)")
    client = hub_client()
    listing = client.list_files(model)
    if gguf_file is None and listing.gguf_files:
        only = listing.only_gguf_model()
        if only is None:
            names = "\n  ".join(f"{f.path} ({f.size / 1e9:.2f} GB)" for f in listing.gguf_models)
            raise ValueError(f"{model} holds several GGUF models; pick one with --file:\n  {names}")
        gguf_file = only.path
    remote = client.probe_model(listing, gguf_file)
    return f"{model}" + (f" {gguf_file}" if gguf_file else "") + " (not downloaded)", remote.shape, remote.job
