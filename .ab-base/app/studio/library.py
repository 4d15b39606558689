"""The local models folder: what is in it, what each model is, import and delete.

A model is either a `.gguf` file (split GGUFs: the `-00001-of-0000N` shards together)
or a folder holding `config.json` and `.safetensors` files, anywhere under the folder.
Descriptions come from the files' headers only (no weights are read), so listing a
folder of large models is quick; they are cached by (path, size, mtime).

Models the user already has in other applications' folders (LM Studio's, the Hugging Face
cache's GGUF files: `StudioPaths.other_models`) are listed too, in place: they are loaded
from where they are, never copied, and never deleted from here.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from app.engine.loader import gguf as gguf_loader
from app.engine.loader.names import CheckpointError, architecture_of
from app.engine.loader.processor_config import read_processor_settings
from app.engine.loader.safetensors import is_unused_tensor
from app.engine.loader.safetensors import read_header as read_safetensors_header
from app.engine.loader.split_tensors import stored_format
from app.engine.plan.fit import (
    OCR,
    TRANSCRIPTION,
    ModelShape,
    audio_beside_gguf,
    audio_from_hf_config,
    folder_job,
    gguf_job,
    is_audio_tensor,
    is_mmproj_name,
    is_vision_tensor,
    shape_from_gguf,
    shape_from_hf_config,
    takes_images,
    vision_beside_gguf,
    vision_from_hf_config,
    with_audio,
    with_images,
)
from app.studio.model_check import INCOMPLETE_HINT, check_model_files
from app.studio.model_parts import GGUF_SHARD_PATTERN, gguf_shards, model_files
from app.studio.paths import ModelSource
from app.studio.tasks import CancelToken, Progress, ProgressCallback, TaskCancelled

PARTIAL_SUFFIX = ".part"  # downloads and imports in progress; never listed
_COPY_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class ModelEntry:
    name: str  # path relative to the models folder: what the user sees and picks
    path: Path  # the .gguf file (first shard) or the safetensors folder
    format: str  # "gguf" | "safetensors"
    files: tuple[Path, ...]
    size_bytes: int
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None  # "Q4_K_M", "BF16", "mixed: ..."
    quant_mix: tuple[tuple[str, int], ...] = ()  # (tensor type, parameters), largest share first
    context_length: int | None = None
    shape: ModelShape | None = None  # for will-it-fit
    error: str | None = None  # why the header could not be read (corrupt, truncated...)
    location: str | None = None  # another application's folder it was found in ("LM Studio"); None: ours
    incomplete: bool = False  # the files stop short of the tensors they declare (model_check.py)
    chat_template: bool | None = None  # whether the checkpoint carries one; None: unknown
    vision: str | None = None  # where its vision tower is (the mmproj file beside it, the folder): it takes images
    job: str | None = None  # what it does: "chat", "chat + images", "embeddings", "transcription"... (plan/job.py)

    @property
    def takes_images(self) -> bool:
        return self.vision is not None

    @property
    def job_note(self) -> tuple[str, str] | None:
        """(label, what it does and where to use it) for a model whose job needs saying where to use it
        (JOB_NOTES); None for the rest."""
        return JOB_NOTES.get(self.job or "")

    @property
    def is_base(self) -> bool:
        """A base (not instruction-tuned) model: no chat template of its own."""
        return self.chat_template is False

    @property
    def usable(self) -> bool:
        return self.architecture is not None and not self.incomplete and self.error is None


# Where to use a model of a job other than chat (plan/job.py): (the Models pane's short label, what it does and
# where to use it). PaddleOCR-VL's ERNIE decoder only reads pages: chatting with it gets OCR output.
_OCR_JOB = ("OCR", "reads the text of page images. Set it as the OCR model (Settings → Documents) and the "
                   "Documents pane reads scanned PDF pages with it.")
JOB_NOTES: dict[str, tuple[str, str]] = {OCR: _OCR_JOB}


# Entries by name, file, size, time and the mmproj files beside it, for the whole process: reading a
# GGUF's header and checking its tensors takes ~0.6 s for a 262k-token vocabulary, and every pane and
# picker that lists the models asks again (each with its own library over the same folder).
_ENTRIES: dict[tuple, ModelEntry] = {}


class ModelLibrary:
    def __init__(self, models_dir: str | os.PathLike[str], other_models: Iterable[ModelSource] = ()) -> None:
        self.root = Path(models_dir).expanduser().resolve()
        self.other_models = tuple(other_models)

    def list(self) -> list[ModelEntry]:
        """Every model under the folder, sorted by name; unreadable files come with `.error` set."""
        if not self.root.is_dir():
            return []
        entries = [self._cached(files) for files in _find_models(self.root)]
        return sorted(entries, key=lambda e: e.name.lower())

    def found_elsewhere(self) -> list[ModelEntry]:
        """The GGUF models in the other applications' folders, named "<application>: <where>".

        A file reached twice (LM Studio's two folders linked together, our own folder inside
        one of them) is listed once, under the first name it was found by.
        """
        seen = {entry.path.resolve() for entry in self.list()}
        found = []
        for source in self.other_models:
            for name, files in _gguf_models_in(source):
                real = files[0].resolve()
                if real in seen or not all(f.is_file() for f in files):  # a hub link to a missing blob
                    continue
                seen.add(real)
                found.append(_with(self._cached(files), name=f"{source.label}: {name}", location=source.label))
        return sorted(found, key=lambda e: e.name.lower())

    def find(self, name: str) -> ModelEntry:
        for entry in self.list():
            if name in (entry.name, entry.path.name, entry.path.stem):
                return entry
        raise KeyError(f"no model named {name!r} in {self.root}")

    def describe(self, path: str | os.PathLike[str]) -> ModelEntry:
        """The entry for one .gguf file or safetensors folder, inside the folder or not."""
        return self._cached(model_files(Path(path).expanduser().resolve()))

    def delete(self, entry: ModelEntry) -> None:
        """Remove the model's files, then folders it leaves empty (never the models folder itself)."""
        path = entry.path.resolve()
        if path == self.root or not path.is_relative_to(self.root):
            raise ValueError(f"{path} is not a model inside {self.root}; not deleting it")
        if entry.format == "safetensors":
            shutil.rmtree(path)
        else:
            for file in entry.files:
                file.unlink(missing_ok=True)
        self._prune_empty(path.parent)

    def import_model(
        self,
        source: str | os.PathLike[str],
        move: bool = False,
        progress: ProgressCallback | None = None,
        token: CancelToken | None = None,
    ) -> ModelEntry:
        """Copy (or move) a .gguf file or a safetensors folder into `<folder>/imported/`."""
        source = Path(source).expanduser().resolve()
        entry = self.describe(source) if source.exists() else None
        if entry is None or (entry.error and entry.architecture is None):
            why = entry.error if entry else "it does not exist"
            raise ValueError(f"cannot import {source}: {why}")
        target_dir = self.root / "imported"
        pairs = (
            [(source, target_dir / source.name)]
            if entry.format == "safetensors"
            else [(f, target_dir / f.name) for f in entry.files]
        )
        for _, target in pairs:
            if target.exists():
                raise FileExistsError(f"{target.name} is already in the library ({target})")
        total = sum(_size(src) for src, _ in pairs)
        copied = 0
        for src, target in pairs:
            copied = _copy_tree(src, target, move, copied, total, progress, token)
        return self.describe(
            target_dir / (source.name if entry.format == "safetensors" else entry.files[0].name)
        )

    def _cached(self, files: tuple[Path, ...]) -> ModelEntry:
        path = files[0]
        try:
            name = str(path.relative_to(self.root))
        except ValueError:
            name = path.name
        stat = path.stat()
        key = (name, str(path), stat.st_size, stat.st_mtime_ns, _mmproj_stamps(path))
        if key not in _ENTRIES:
            if path.is_dir():
                _ENTRIES[key] = describe_safetensors_folder(path, files[1:], name)
            else:
                _ENTRIES[key] = describe_gguf(files, name)
        return _ENTRIES[key]

    def _prune_empty(self, folder: Path) -> None:
        while folder != self.root and folder.is_relative_to(self.root):
            try:
                folder.rmdir()  # only succeeds when empty
            except OSError:
                return
            folder = folder.parent


def default_models_dir() -> Path:
    """The models folder the Studio uses: the `models.folder` setting, else the default in the user data."""
    from app.studio.paths import studio_paths
    from app.studio.settings import Settings

    paths = studio_paths()
    return Path(Settings.load(paths.settings_file).get("models.folder") or paths.models_dir)


def find_model(name: str, models_dir: str | os.PathLike[str] | None = None,
               other_models: Iterable[ModelSource] | None = None) -> Path | None:
    """The path of the model called `name` (its full name, file name or stem) in the library, else
    in the other applications' folders (default: this user's), or None."""
    from app.studio.paths import studio_paths

    library = ModelLibrary(models_dir or default_models_dir(),
                           studio_paths().other_models if other_models is None else other_models)
    try:
        return library.find(name).path
    except KeyError:
        pass
    for entry in library.found_elsewhere():
        if name in (entry.name, entry.path.name, entry.path.stem):
            return entry.path
    return None


def _gguf_models_in(source: ModelSource) -> Iterable[tuple[str, tuple[Path, ...]]]:
    """(name, shards) of each GGUF model in another application's folder; nothing when it is absent."""
    if not source.path.is_dir():
        return
    if source.layout != "hub":
        for files in _find_models(source.path):
            if files[0].suffix == ".gguf":
                yield str(files[0].relative_to(source.path)), files
        return
    for repo in sorted(source.path.glob("models--*")):
        snapshot = _current_snapshot(repo)
        if snapshot is None:
            continue
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        for files in _find_models(snapshot):
            if files[0].suffix == ".gguf":
                yield f"{repo_id}/{files[0].relative_to(snapshot)}", files


def _current_snapshot(repo: Path) -> Path | None:
    """The snapshot `refs/main` names, else the newest one: older revisions are not offered."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        named = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if named.is_dir():
            return named
    snapshots = [s for s in (repo / "snapshots").glob("*") if s.is_dir()]
    return max(snapshots, key=lambda s: s.stat().st_mtime, default=None)


def is_base_model(path: str | os.PathLike[str]) -> bool:
    """True when the checkpoint at `path` has no chat template of its own (False when it cannot be read)."""
    path = Path(path)
    try:
        if path.is_dir():
            return _folder_has_chat_template(path) is False
        if not path.is_file():
            return False
        with open(path, "rb") as stream:
            return "tokenizer.chat_template" not in read_gguf_header(stream).metadata
    except (OSError, ValueError):
        return False


def _find_models(root: Path) -> Iterable[tuple[Path, ...]]:
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .cache and the like
        here = Path(folder)
        safetensors = sorted(here / n for n in names if n.endswith(".safetensors"))
        if safetensors and "config.json" in names:
            yield (here, *safetensors)
        for name in sorted(names):
            match = GGUF_SHARD_PATTERN.match(name)
            if is_mmproj_name(name):  # a vision projector: part of the model beside it, not a model
                continue
            if name.endswith(".gguf") and (match is None or int(match["index"]) == 1):
                yield gguf_shards(here / name)


def describe_gguf(files: tuple[Path, ...], name: str) -> ModelEntry:
    size = sum(f.stat().st_size for f in files if f.exists())
    base = ModelEntry(name=name, path=files[0], format="gguf", files=files, size_bytes=size)
    try:
        headers = []
        for file in files:
            with open(file, "rb") as stream:
                headers.append(read_gguf_header(stream))
    except HeaderIncomplete as exc:
        return _with(base, incomplete=True, error=f"{name}: {INCOMPLETE_HINT} ({exc})")
    except (OSError, ValueError) as exc:
        return _with(base, error=f"{name}: {exc}")
    meta = headers[0].metadata
    tensors = [t for h in headers for t in h.tensors]
    entry = _with(base, chat_template="tokenizer.chat_template" in meta, **gguf_summary(meta, tensors))
    return _with_file_check(_with_mmproj(entry))


def _mmproj_stamps(path: Path) -> tuple[tuple[str, int, int], ...]:
    """The mmproj files beside a GGUF, with size and time: one added or removed changes the entry."""
    if path.is_dir():
        return ()
    found = [p for p in path.parent.glob("*.gguf") if is_mmproj_name(p.name)]
    return tuple(sorted((p.name, (st := p.stat()).st_size, st.st_mtime_ns) for p in found))


def _with_mmproj(entry: ModelEntry) -> ModelEntry:
    """The entry with what the engine would load from the mmproj beside it, if any: the vision tower (a chat
    model then takes images), a Gemma 4 mmproj's audio half (it takes audio too), or the audio encoder a
    speech model's mmproj holds (Granite Speech's, Qwen3-ASR's: then its job is transcription)."""
    if entry.shape is None:
        return entry
    try:
        vision = vision_beside_gguf(entry.path, entry.shape.architecture)
        audio = audio_beside_gguf(entry.path, entry.shape.architecture)
    except (OSError, ValueError) as exc:  # two mmproj files, or a broken one: loading would fail the same way
        return _with(entry, error=entry.error or f"{entry.name}: {exc}")
    if vision is None and audio is None:
        return entry
    job = with_images(entry.job) if vision is not None else entry.job
    if audio is not None:
        job = with_audio(job) if takes_images(entry.shape.architecture) else TRANSCRIPTION
    return _with(entry, vision=vision.source if vision is not None else None, job=job,
                 shape=replace(entry.shape, vision=vision, audio=audio))  # fmt: skip


def _with_file_check(entry: ModelEntry) -> ModelEntry:
    problem = check_model_files(entry.files if entry.format == "gguf" else (entry.path, *entry.files))
    if problem is None:
        return entry
    return _with(entry, incomplete=problem.incomplete, error=entry.error or f"{entry.name}: {problem.message}")


def gguf_summary(meta: dict, tensors: list[GGUFTensorInfo]) -> dict:
    """ModelEntry fields from a GGUF header (shared with the hub probe in downloads.py)."""
    mix = Counter[str]()
    for tensor in tensors:
        mix[tensor.type_name] += tensor.n_elements
    weight_bytes = sum(t.nbytes for t in tensors)
    fields: dict = dict(
        architecture=meta.get("general.architecture"),
        parameters=sum(mix.values()),
        quantization=_gguf_file_type(meta.get("general.file_type"), mix),
        quant_mix=tuple(mix.most_common()),
        job=gguf_job(meta, (t.name for t in tensors)),
    )
    try:
        fields["shape"] = shape_from_gguf(meta, weight_bytes)
        fields["context_length"] = fields["shape"].context_length
    except (ValueError, TypeError, KeyError) as exc:
        fields["error"] = f"cannot read the model's shape: {exc}"
    return fields


def _gguf_file_type(file_type: int | None, mix: Counter[str]) -> str:
    from gguf.constants import LlamaFileType

    try:
        label = LlamaFileType(int(file_type)).name  # type: ignore[arg-type]
        if label != "GUESSED":
            return label.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        pass
    return "mixed: " + ", ".join(name for name, _ in mix.most_common())


def describe_safetensors_folder(folder: Path, files: tuple[Path, ...], name: str) -> ModelEntry:
    size = sum(f.stat().st_size for f in files)
    base = ModelEntry(name=name, path=folder, format="safetensors", files=files, size_bytes=size)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        mix = Counter[str]()
        weight_bytes = vision_bytes = 0
        audio_sizes = []
        for file in files:
            table, _ = read_safetensors_header(file)  # the loader's own reader, as model_check.py
            table.pop("__metadata__", None)
            for name, tensor in table.items():
                if is_unused_tensor(name):  # BatchNorm's step counter: the loader leaves it out
                    continue
                # Quantized weights count under their format (FP8_E4M3, NVFP4_SPLIT, ...), scales with them.
                stored = stored_format(name, tensor["dtype"])
                if stored is not None:
                    mix[stored[0]] += _product(tensor["shape"]) * stored[1]
                size = tensor["data_offsets"][1] - tensor["data_offsets"][0]
                if is_audio_tensor(name, config):  # the audio side (Gemma 4's tower; a speech model's adapter too): apart
                    audio_sizes.append((name, size))
                elif is_vision_tensor(name):  # the image tower: its own line in will-it-fit
                    vision_bytes += size
                else:
                    weight_bytes += size
        shape = shape_from_hf_config(config, weight_bytes)
        audio = audio_from_hf_config(config, audio_sizes, f"{folder.name}/*.safetensors", folder)
        processor = read_processor_settings(folder, "image_processor").values  # either layout
        vision = vision_from_hf_config(config, vision_bytes, f"{folder.name}/*.safetensors", processor)
        if vision is not None and takes_images(_engine_architecture(config)):  # as the loader decides
            shape = replace(shape, vision=vision)
        shape = replace(shape, audio=audio)
        job = folder_job(folder, config, images=shape.vision is not None)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _with(base, error=f"{name}: {exc}")
    quant = (config.get("quantization_config") or {}).get("quant_method")
    dtypes = ", ".join(d for d, _ in mix.most_common())
    return _with_file_check(_with(
        base,
        chat_template=_folder_has_chat_template(folder),
        architecture=shape.architecture,
        parameters=sum(mix.values()),
        quantization=f"{quant} ({dtypes})" if quant else (dtypes if len(mix) == 1 else f"mixed: {dtypes}"),
        quant_mix=tuple(mix.most_common()),
        context_length=shape.context_length,
        shape=shape,
        vision=shape.vision.source if shape.vision else None,
        job=job,
    ))


def _folder_has_chat_template(folder: Path) -> bool | None:
    """Hugging Face folders keep the template in tokenizer_config.json or chat_template.jinja."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(config.get("chat_template")) if isinstance(config, dict) else None


def _with(entry: ModelEntry, **fields) -> ModelEntry:
    return replace(entry, **fields)


def _engine_architecture(config: dict[str, Any]) -> str:
    """The engine's family name for a config.json ("" for one it does not run)."""
    try:
        return architecture_of(config)
    except CheckpointError:
        return ""


def _product(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def _copy_tree(
    src: Path,
    dst: Path,
    move: bool,
    done: int,
    total: int,
    progress: ProgressCallback | None,
    token: CancelToken | None,
) -> int:
    """Copy a file or folder through `.part` names so a cancelled copy leaves nothing half-made."""
    if src.is_dir():
        for child in sorted(src.iterdir()):
            if not child.name.startswith("."):
                done = _copy_tree(child, dst / child.name, move, done, total, progress, token)
        if move:
            shutil.rmtree(src, ignore_errors=True)
        return done
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(dst.name + PARTIAL_SUFFIX)
    try:
        with open(src, "rb") as reader, open(partial, "wb") as writer:
            while chunk := reader.read(_COPY_CHUNK):
                if token is not None and token.cancelled:
                    raise TaskCancelled(f"import of {src.name} cancelled")
                writer.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(Progress(done, total, src.name))
        os.replace(partial, dst)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if move:
        src.unlink()
    return done


# --- file headers: read without touching the weights -------------------------------------------


class HeaderIncomplete(ValueError):
    """The bytes ended inside a file header: a truncated file, or a prefix that was too short."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: fastest-varying first
    type_id: int
    offset: int

    @property
    def n_elements(self) -> int:
        return _product(list(self.dims))

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type{self.type_id}"

    @property
    def nbytes(self) -> int:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {self.name!r} has an unknown GGML type {self.type_id}") from None
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict
    tensors: list[GGUFTensorInfo]


def read_gguf_header(stream: BinaryIO) -> GGUFHeader:
    """Metadata and tensor infos of a GGUF file (or of a prefix of one, e.g. from an HTTP range)."""
    try:
        version, metadata, tensors = gguf_loader.read_gguf_header(stream)
    except EOFError as exc:
        raise HeaderIncomplete(str(exc)) from None
    return GGUFHeader(version, metadata, [GGUFTensorInfo(*tensor) for tensor in tensors])
