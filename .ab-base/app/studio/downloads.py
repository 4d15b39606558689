"""Hugging Face hub: search, list a repo's files with sizes, download into the models folder.

Search is one plain request to the hub's `/api/models` and the listing goes through
`huggingface_hub.HfApi`, each tried once with a short timeout: huggingface_hub's own retry loop
(five retries with back-off, each logged) kept a worker thread retrying and logging long after
the Studio had said the hub does not answer, and past interpreter exit. A hub that cannot be
reached raises `HubUnreachable`, which the UI shows as "offline" with a Retry. The transfer itself is our own
streaming loop so the UI gets byte progress, a cancel that takes effect within one
chunk, and resume across restarts:

- a file downloads to `<name>.part` beside its final place, with `<name>.part.json`
  recording what it is (revision, size, checksum). Starting again after a cancel,
  a crash or a dropped connection continues from the part's length with an HTTP Range
  request, provided the sidecar still describes the same file;
- every file is verified before it gets its final name: LFS files against the sha256
  in the hub's LFS metadata, small files against their git blob id. A mismatch
  deletes the part and raises `ChecksumMismatch`.

Files land in `<models folder>/<owner>/<repo>/<path in repo>`: standard files any
other tool can open. A GGUF model's download takes its mmproj companion (the vision projector
beside it in the repo, mmproj.py) along by default, so the model arrives able to read images.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from app.engine.plan.fit import (
    ModelShape,
    VisionShape,
    shape_from_hf_config,
    takes_images,
    vision_from_mmproj,
    with_images,
)
from app.studio.library import (
    PARTIAL_SUFFIX,
    HeaderIncomplete,
    gguf_summary,
    read_gguf_header,
)
from app.studio.mmproj import is_mmproj, pick_mmproj
from app.studio.model_parts import GGUF_SHARD_PATTERN
from app.studio.tasks import CancelToken, Progress, ProgressCallback, TaskCancelled

DEFAULT_ENDPOINT = "https://huggingface.co"
HUB_CALL_TIMEOUT_S = 5.0  # search and listing: the UI calls a hub silent this long offline (HUB_WAIT_MS)
_GGUF_PROBE_PIECE = 4 * 1024 * 1024  # per range request; a 262k-token vocabulary's header is ~6.5 MB
_GGUF_PROBE_LIMIT = 128 * 1024 * 1024  # no real header is larger
# What a safetensors model needs besides its weights: its tokenizer and template, its image/audio
# processor's settings in either layout (transformers 5 writes processor_config.json only), and a
# sentence-transformers embedder's pooling and query prompt.
_SUPPORT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "tokenizer.model", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                  "model.safetensors.index.json", "preprocessor_config.json", "processor_config.json",
                  "video_preprocessor_config.json", "modules.json", "1_Pooling/config.json",
                  "config_sentence_transformers.json")


class DownloadError(Exception):
    """A hub request or transfer failed; the message is meant for the user."""


class HubUnreachable(DownloadError):
    """No answer from the hub: no network, no such host, a refused or silent connection."""


class ChecksumMismatch(DownloadError):
    """The downloaded bytes are not the file the hub listed (the damaged copy is deleted)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str  # inside the repo
    size: int
    sha256: str | None = None  # LFS files
    blob_id: str | None = None  # git blob sha1 (small files)


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    revision: str  # the commit all downloads of this listing are pinned to
    files: tuple[RemoteFile, ...]

    def file(self, path: str) -> RemoteFile:
        for remote in self.files:
            if remote.path == path:
                return remote
        raise DownloadError(f"{self.repo_id} has no file {path!r}")

    @property
    def gguf_files(self) -> list[RemoteFile]:
        return [f for f in self.files if f.path.endswith(".gguf")]

    @property
    def gguf_models(self) -> list[RemoteFile]:
        """The GGUF files a user chooses between: split models by their first shard; no projectors."""
        return [
            f for f in self.gguf_files
            if not is_mmproj(f.path)
            and ((m := GGUF_SHARD_PATTERN.match(Path(f.path).name)) is None or int(m["index"]) == 1)
        ]

    def files_for(self, path: str, vision: bool = True) -> list[RemoteFile]:
        """What downloading `path` takes: every shard of a split GGUF, else the file itself; with
        `vision`, the model's mmproj companion too (`mmproj_for`), so that it takes images."""
        files = _shards_of(self, self.file(path))
        companion = self.mmproj_for(path) if vision else None
        return files + ([companion] if companion is not None and companion not in files else [])

    def mmproj_for(self, path: str) -> RemoteFile | None:
        """The vision projector that goes with the GGUF model `path` (mmproj.py's pick), or None."""
        return pick_mmproj(self.files, path)

    def only_gguf_model(self) -> RemoteFile | None:
        """The repo's single GGUF model when there is exactly one, else None (the user must choose)."""
        return self.gguf_models[0] if len(self.gguf_models) == 1 else None

    def default_selection(self) -> list[RemoteFile]:
        """A safetensors model's weights and support files; GGUF repos need a file chosen (empty)."""
        if self.gguf_files:
            return []
        return [f for f in self.files if f.path.endswith(".safetensors") or f.path in _SUPPORT_FILES]


@dataclass(frozen=True)
class SearchHit:
    repo_id: str
    downloads: int
    likes: int
    tags: tuple[str, ...]
    last_modified: str | None

    @property
    def has_gguf(self) -> bool:
        return "gguf" in self.tags


@dataclass(frozen=True)
class RemoteModel:
    """What will-it-fit and the UI know about a model before it is downloaded."""

    repo_id: str
    files: tuple[RemoteFile, ...]
    shape: ModelShape
    architecture: str | None
    quantization: str | None
    parameters: int | None
    job: str | None = None  # what a GGUF does, read from its header (plan/job.py); None: not read (a folder)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


def model_folder(models_dir: str | os.PathLike[str], repo_id: str) -> Path:
    return Path(models_dir) / Path(*repo_id.split("/"))


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        # Read HF_ENDPOINT now rather than at import, so a test or a setting can point elsewhere.
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.token = token
        self.timeout = timeout

    def _api(self) -> Any:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token)

    def _headers(self) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers(token=self.token, library_name="paddock-studio")

    def search(self, query: str, limit: int = 20, gguf_only: bool = False) -> list[SearchHit]:
        """Models matching `query`, most downloaded first (one request, no retries)."""
        params: dict[str, str | int] = {"sort": "downloads", "direction": -1, "limit": limit}
        if query:
            params["search"] = query
        if gguf_only:
            params["filter"] = "gguf"
        with _hub_errors(f"search for {query!r}", self.endpoint):
            response = httpx.get(f"{self.endpoint}/api/models", params=params, headers=self._headers(),
                                 timeout=HUB_CALL_TIMEOUT_S, follow_redirects=True)
        if response.status_code >= 400:
            raise DownloadError(f"search for {query!r}: the hub answered HTTP {response.status_code}")
        try:
            found = response.json()
            return [
                SearchHit(m["id"], int(m.get("downloads") or 0), int(m.get("likes") or 0), tuple(m.get("tags") or ()),
                          m.get("lastModified"))
                for m in found[:limit]
            ]
        except (ValueError, TypeError, KeyError) as exc:
            raise DownloadError(f"search for {query!r}: the hub's answer is not a model list ({exc})") from exc

    def list_files(self, repo_id: str, revision: str | None = None) -> RepoListing:
        """Every file of the repo with its size and checksum, pinned to the current commit."""
        with _hub_errors(repo_id, self.endpoint):
            info = self._api().model_info(repo_id, revision=revision, files_metadata=True,
                                          timeout=HUB_CALL_TIMEOUT_S)
        files = tuple(
            RemoteFile(
                path=s.rfilename,
                size=int(s.lfs.size if s.lfs else s.size or 0),
                sha256=s.lfs.sha256 if s.lfs else None,
                blob_id=None if s.lfs else s.blob_id,
            )
            for s in info.siblings or ()
        )
        return RepoListing(repo_id, info.sha or revision or "main", files)

    def file_url(self, listing: RepoListing, path: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(listing.repo_id, path, revision=listing.revision, endpoint=self.endpoint)

    def read_range(self, listing: RepoListing, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a remote file (e.g. a GGUF header before download)."""
        headers = {**self._headers(), "Range": f"bytes={start}-{end - 1}"}
        with _transfer_errors(path):
            response = httpx.get(self.file_url(listing, path), headers=headers, follow_redirects=True,
                                 timeout=self.timeout)
        _raise_for_status(response, listing.repo_id, path)
        return response.content[: end - start] if response.status_code == 200 else response.content

    def read_text(self, listing: RepoListing, path: str) -> str:
        return self.read_range(listing, path, 0, listing.file(path).size or 1).decode("utf-8")

    def download(
        self,
        listing: RepoListing,
        files: Sequence[str | RemoteFile],
        models_dir: str | os.PathLike[str],
        progress: ProgressCallback | None = None,
        token: CancelToken | None = None,
    ) -> list[Path]:
        """Download `files` into the repo's folder under `models_dir`; returns their final paths."""
        remote = [listing.file(f) if isinstance(f, str) else f for f in files]
        if not remote:
            raise DownloadError(f"no files chosen from {listing.repo_id}")
        folder = model_folder(models_dir, listing.repo_id)
        folder.mkdir(parents=True, exist_ok=True)
        total = sum(f.size for f in remote)
        _check_disk_space(folder, total - sum(_already_have(folder / f.path, f) for f in remote))
        done = 0
        paths = []
        for file in remote:
            target = folder / file.path
            base = done

            def report(n: int, name: str = file.path, base: int = base) -> None:
                if progress is not None:
                    progress(Progress(base + n, total, name))

            self._download_one(listing, file, target, report, token or CancelToken())
            done += file.size
            paths.append(target)
        return paths

    def _download_one(self, listing: RepoListing, file: RemoteFile, target: Path, report: Any,
                      token: CancelToken) -> None:
        if target.exists() and target.stat().st_size == file.size:
            report(file.size)  # only verified files ever get their final name
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + PARTIAL_SUFFIX)
        sidecar = target.with_name(target.name + PARTIAL_SUFFIX + ".json")
        identity = {"repo": listing.repo_id, "path": file.path, "size": file.size,
                    "sha256": file.sha256, "blob_id": file.blob_id}
        if not (part.exists() and _read_json(sidecar) == identity and part.stat().st_size <= file.size):
            part.unlink(missing_ok=True)
            sidecar.write_text(json.dumps(identity))
        hasher = _Checksum(file)
        offset = hasher.feed_file(part)
        report(offset)
        if offset < file.size:
            self._stream_into(listing, file, part, offset, hasher, report, token)
        have = part.stat().st_size
        if have < file.size:  # the server ended the body early without an error: resumable
            raise DownloadError(f"download of {file.path} stopped at {have} of {file.size} bytes; "
                                "start again to resume")
        actual = hasher.hexdigest()
        if have != file.size or actual != hasher.expected:
            part.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{file.path} from {listing.repo_id} is damaged: expected {hasher.kind} {hasher.expected}, "
                f"got {actual} ({part.name} deleted; download it again)"
            )
        os.replace(part, target)
        sidecar.unlink(missing_ok=True)

    def _stream_into(self, listing: RepoListing, file: RemoteFile, part: Path, offset: int,
                     hasher: _Checksum, report: Any, token: CancelToken) -> None:
        headers = self._headers()
        if offset:
            headers["Range"] = f"bytes={offset}-"
        timeout = httpx.Timeout(self.timeout, read=self.timeout)
        try:
            with (
                _transfer_errors(file.path, part),
                httpx.Client(follow_redirects=True, timeout=timeout) as client,
                client.stream("GET", self.file_url(listing, file.path), headers=headers) as response,
            ):
                token.on_cancel(lambda: _abort(response))  # wakes a read blocked on the socket at once
                _raise_for_status(response, listing.repo_id, file.path)
                if response.status_code != 206 and offset:  # the server ignored the Range: start over
                    hasher.reset()
                    offset = 0
                with open(part, "ab" if offset else "wb") as out:
                    for chunk in response.iter_bytes():  # as received: a drop loses nothing
                        token.raise_if_cancelled()
                        out.write(chunk)
                        hasher.update(chunk)
                        offset += len(chunk)
                        report(offset)
                    out.flush()
                    os.fsync(out.fileno())
        except Exception:
            token.raise_if_cancelled()  # an error caused by the cancel is a cancel (the part is kept)
            raise

    def probe_model(self, listing: RepoListing, gguf_file: str | None = None, vision: bool = True) -> RemoteModel:
        """The model's shape without downloading it: a GGUF's header via range requests, or config.json.
        With `vision`, a GGUF's mmproj companion counts too (its header read the same way)."""
        if gguf_file is None and listing.gguf_files:
            only = listing.only_gguf_model()
            if only is None:
                raise DownloadError(f"{listing.repo_id} holds several GGUF models; choose one")
            gguf_file = only.path
        if gguf_file is not None:
            model = self._probe_gguf(listing, listing.file(gguf_file))
            companion = listing.mmproj_for(gguf_file) if vision else None
            if companion is None or not takes_images(model.shape.architecture):
                return model
            shape = replace(model.shape, vision=self._probe_mmproj(listing, companion))
            return replace(model, files=(*model.files, companion), shape=shape, job=with_images(model.job))
        weights = tuple(f for f in listing.files if f.path.endswith(".safetensors"))
        try:
            config = json.loads(self.read_text(listing, "config.json"))
            shape = shape_from_hf_config(config, sum(f.size for f in weights))
        except (ValueError, KeyError, TypeError) as exc:
            raise DownloadError(f"cannot read the model shape of {listing.repo_id}: {exc}") from exc
        return RemoteModel(listing.repo_id, weights, shape, shape.architecture, None, None)

    def _probe_gguf(self, listing: RepoListing, file: RemoteFile) -> RemoteModel:
        try:
            header = read_gguf_header(_RemoteReader(self, listing, file))
        except HeaderIncomplete:
            raise DownloadError(f"{file.path}: no complete GGUF header in its first "
                                f"{min(file.size, _GGUF_PROBE_LIMIT)} bytes") from None
        except ValueError as exc:
            raise DownloadError(f"{file.path} is not a readable GGUF file: {exc}") from exc
        shards = _shards_of(listing, file)
        fields = gguf_summary(header.metadata, header.tensors)
        if "shape" not in fields:
            raise DownloadError(f"{file.path}: {fields.get('error')}")
        shape = fields["shape"]
        if len(shards) > 1:  # later shards hold the rest of the weights: count them by size
            rest = sum(f.size for f in shards if f is not file)
            shape = replace(shape, weight_bytes=shape.weight_bytes + rest)
        return RemoteModel(listing.repo_id, tuple(shards), shape, fields.get("architecture"),
                           fields.get("quantization"), fields.get("parameters"), fields.get("job"))


    def _probe_mmproj(self, listing: RepoListing, file: RemoteFile) -> VisionShape:
        try:
            header = read_gguf_header(_RemoteReader(self, listing, file))
            return vision_from_mmproj(header.metadata, sum(t.nbytes for t in header.tensors), Path(file.path).name)
        except HeaderIncomplete:
            raise DownloadError(f"{file.path}: no complete GGUF header in its first "
                                f"{min(file.size, _GGUF_PROBE_LIMIT)} bytes") from None
        except ValueError as exc:
            raise DownloadError(f"{file.path} is not a readable mmproj file: {exc}") from exc


class _RemoteReader:
    """A read-only file over HTTP range requests, fetched piece by piece as the header parser asks."""

    def __init__(self, client: HubClient, listing: RepoListing, file: RemoteFile) -> None:
        self.client, self.listing, self.file = client, listing, file
        self.end = min(file.size, _GGUF_PROBE_LIMIT)
        self.pos = 0

    def read(self, n: int) -> bytes:
        if self.pos >= self.end:
            return b""
        stop = min(self.pos + _GGUF_PROBE_PIECE, self.end)  # a short read: the parser asks again
        data = self.client.read_range(self.listing, self.file.path, self.pos, stop)
        self.pos += len(data)
        return data


def discard_partial(target: str | os.PathLike[str]) -> None:
    """Forget a paused download of `target` (its .part file and sidecar)."""
    target = Path(target)
    target.with_name(target.name + PARTIAL_SUFFIX).unlink(missing_ok=True)
    target.with_name(target.name + PARTIAL_SUFFIX + ".json").unlink(missing_ok=True)


def _shards_of(listing: RepoListing, file: RemoteFile) -> list[RemoteFile]:
    match = GGUF_SHARD_PATTERN.match(Path(file.path).name)
    if match is None:
        return [file]
    prefix = file.path[: len(file.path) - len(Path(file.path).name)] + match["stem"]
    return [f for f in listing.files if f.path.startswith(prefix) and GGUF_SHARD_PATTERN.match(Path(f.path).name)]


class _Checksum:
    """sha256 for LFS files; the git blob sha1 (`blob <size>\\0` + content) for small ones."""

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        self.kind = "sha256" if file.sha256 else "git blob sha1" if file.blob_id else "size"
        self.expected = file.sha256 or file.blob_id or ""
        self.reset()

    def reset(self) -> None:
        if self.file.sha256:
            self._hash = hashlib.sha256()
        else:
            self._hash = hashlib.sha1(f"blob {self.file.size}\0".encode(), usedforsecurity=False)

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def feed_file(self, path: Path) -> int:
        """Hash what an earlier attempt already wrote; returns its length."""
        if not path.exists():
            return 0
        with open(path, "rb") as handle:
            while chunk := handle.read(8 * 1024 * 1024):
                self.update(chunk)
        return path.stat().st_size

    def hexdigest(self) -> str:
        return self._hash.hexdigest() if self.expected else ""


def bytes_present(models_dir: str | os.PathLike[str], listing: RepoListing, file: RemoteFile) -> int:
    """How much of `file` is already on disk: its size when complete, a paused part's length, or 0."""
    return _already_have(model_folder(models_dir, listing.repo_id) / file.path, file)


def _already_have(target: Path, file: RemoteFile) -> int:
    if target.exists() and target.stat().st_size == file.size:
        return file.size
    part = target.with_name(target.name + PARTIAL_SUFFIX)
    return min(part.stat().st_size, file.size) if part.exists() else 0


def _check_disk_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(f"not enough disk space in {folder}: {needed / 1e9:.2f} GB needed, "
                            f"{free / 1e9:.2f} GB free")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _raise_for_status(response: httpx.Response, repo_id: str, path: str) -> None:
    status = response.status_code
    if status < 400:
        return
    reasons = {
        401: "the hub wants a valid Hugging Face token (set one under Models)",
        403: "access denied: the repo may be gated (accept its licence on the hub) or your token lacks access",
        404: "not found on the hub",
        416: "the hub refused the byte range",
    }
    reason = reasons.get(status, f"the hub answered HTTP {status}")
    raise DownloadError(f"{repo_id}/{path}: {reason}")


class _hub_errors:
    """Turns huggingface_hub and connection errors into DownloadError with a readable message."""

    def __init__(self, what: str, endpoint: str) -> None:
        self.what, self.endpoint = what, endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, (DownloadError, TaskCancelled)):
            return False
        from huggingface_hub import errors

        if isinstance(exc, errors.GatedRepoError):
            message = f"{self.what} is gated: accept its licence on the hub and set your Hugging Face token"
        elif isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError)):
            message = f"{self.what} was not found on the hub (or it is private and needs a token)"
        elif isinstance(exc, errors.HfHubHTTPError):
            message = f"{self.what}: the hub answered {exc.response.status_code if exc.response else 'an error'}"
        elif type(exc).__module__.split(".")[0] in ("httpx", "httpx2") or isinstance(exc, OSError):
            raise HubUnreachable(f"cannot reach the Hugging Face hub at {self.endpoint} "
                                 f"({type(exc).__name__}: {exc})") from exc
        else:
            return False
        raise DownloadError(message) from exc


class _transfer_errors(_hub_errors):
    """A dropped transfer keeps its .part file: say so, since starting again resumes it."""

    def __init__(self, path: str, part: Path | None = None) -> None:
        super().__init__(path, "")
        self.part = part

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, httpx.ConnectError):
            raise HubUnreachable(f"cannot reach the hub for {self.what} ({exc})") from exc
        if isinstance(exc, httpx.TransportError):
            have = self.part.stat().st_size if self.part and self.part.exists() else 0
            resume = f"; {have} bytes kept, start again to resume" if self.part else ""
            raise DownloadError(f"download of {self.what} was interrupted ({type(exc).__name__}: {exc}){resume}") \
                from exc
        return False


def _abort(response: httpx.Response) -> None:
    """Stop a transfer from another thread: closing the response alone does not wake a read
    blocked on a silent connection (Linux), shutting the socket down does."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()
