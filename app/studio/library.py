"""The local models folder: what is in it, what each model is, import and delete.

A model is either a `.gguf` file (split GGUFs: the `-00001-of-0000N` shards together)
or a folder holding `config.json` and `.safetensors` files, anywhere under the folder.
Descriptions come from the files' headers only (no weights are read), so listing a
folder of large models is quick; they are cached by (path, size, mtime).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from app.engine.core.fit import ModelShape, shape_from_gguf, shape_from_hf_config
from app.engine.loader import gguf as gguf_loader
from app.studio.tasks import CancelToken, Progress, ProgressCallback, TaskCancelled

PARTIAL_SUFFIX = ".part"  # downloads and imports in progress; never listed
GGUF_SHARD_PATTERN = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
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


class ModelLibrary:
    def __init__(self, models_dir: str | os.PathLike[str]) -> None:
        self.root = Path(models_dir).expanduser().resolve()
        self._cache: dict[tuple[str, int, int], ModelEntry] = {}

    def list(self) -> list[ModelEntry]:
        """Every model under the folder, sorted by name; unreadable files come with `.error` set."""
        if not self.root.is_dir():
            return []
        entries = [self._cached(files) for files in _find_models(self.root)]
        return sorted(entries, key=lambda e: e.name.lower())

    def find(self, name: str) -> ModelEntry:
        for entry in self.list():
            if name in (entry.name, entry.path.name, entry.path.stem):
                return entry
        raise KeyError(f"no model named {name!r} in {self.root}")

    def describe(self, path: str | os.PathLike[str]) -> ModelEntry:
        """The entry for one .gguf file or safetensors folder, inside the folder or not."""
        path = Path(path).expanduser().resolve()
        if path.is_dir():
            files = tuple(sorted(path.glob("*.safetensors")))
            return self._cached((path, *files))
        return self._cached(_gguf_shards(path))

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
        return self.describe(target_dir / (source.name if entry.format == "safetensors" else entry.files[0].name))

    def _cached(self, files: tuple[Path, ...]) -> ModelEntry:
        stat = files[0].stat()
        key = (str(files[0]), stat.st_size, stat.st_mtime_ns)
        if key not in self._cache:
            self._cache[key] = self._read(files)
        return self._cache[key]

    def _read(self, files: tuple[Path, ...]) -> ModelEntry:
        path = files[0]
        try:
            name = str(path.relative_to(self.root))
        except ValueError:
            name = path.name
        if path.is_dir():
            return describe_safetensors_folder(path, files[1:], name)
        return describe_gguf(files, name)

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


def find_model(name: str, models_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The path of the library model called `name` (its full name, file name or stem), or None."""
    try:
        return ModelLibrary(models_dir or default_models_dir()).find(name).path
    except KeyError:
        return None


def _find_models(root: Path) -> Iterable[tuple[Path, ...]]:
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .cache and the like
        here = Path(folder)
        safetensors = sorted(here / n for n in names if n.endswith(".safetensors"))
        if safetensors and "config.json" in names:
            yield (here, *safetensors)
        for name in sorted(names):
            match = GGUF_SHARD_PATTERN.match(name)
            if name.endswith(".gguf") and (match is None or int(match["index"]) == 1):
                yield _gguf_shards(here / name)


def _gguf_shards(path: Path) -> tuple[Path, ...]:
    match = GGUF_SHARD_PATTERN.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    return tuple(path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))


def describe_gguf(files: tuple[Path, ...], name: str) -> ModelEntry:
    size = sum(f.stat().st_size for f in files if f.exists())
    base = ModelEntry(name=name, path=files[0], format="gguf", files=files, size_bytes=size)
    try:
        headers = []
        for file in files:
            with open(file, "rb") as stream:
                headers.append(read_gguf_header(stream))
    except (OSError, ValueError) as exc:
        return _with(base, error=f"{name}: {exc}")
    meta = headers[0].metadata
    tensors = [t for h in headers for t in h.tensors]
    return _with(base, **gguf_summary(meta, tensors))


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
        weight_bytes = 0
        for file in files:
            with open(file, "rb") as stream:
                for tensor in read_safetensors_header(stream).values():
                    mix[tensor["dtype"]] += _product(tensor["shape"])
                    weight_bytes += tensor["data_offsets"][1] - tensor["data_offsets"][0]
        shape = shape_from_hf_config(config, weight_bytes)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _with(base, error=f"{name}: {exc}")
    quant = (config.get("quantization_config") or {}).get("quant_method")
    dtypes = ", ".join(d for d, _ in mix.most_common())
    return _with(
        base,
        architecture=shape.architecture,
        parameters=sum(mix.values()),
        quantization=f"{quant} ({dtypes})" if quant else (dtypes if len(mix) == 1 else f"mixed: {dtypes}"),
        quant_mix=tuple(mix.most_common()),
        context_length=shape.context_length,
        shape=shape,
    )


def _with(entry: ModelEntry, **fields) -> ModelEntry:
    from dataclasses import replace

    return replace(entry, **fields)


def _product(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def _copy_tree(src: Path, dst: Path, move: bool, done: int, total: int,
               progress: ProgressCallback | None, token: CancelToken | None) -> int:
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


def read_safetensors_header(stream: BinaryIO) -> dict[str, dict]:
    """The tensor table of a .safetensors file: name -> {dtype, shape, data_offsets}."""
    head = stream.read(8)
    if len(head) < 8:
        raise ValueError("not a safetensors file (shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", head)
    if length > 100 * 1024 * 1024:
        raise ValueError(f"not a safetensors file (header length {length} is implausible)")
    raw = stream.read(length)
    if len(raw) < length:
        raise HeaderIncomplete("the file ends inside its safetensors header")
    table = json.loads(raw)
    table.pop("__metadata__", None)
    return table
