"""A local HTTP server that imitates the Hugging Face hub endpoints huggingface-hub and downloads.py call.

- GET /api/models?search=...            search (a JSON list of model summaries)
- GET /api/models/{repo}[/revision/{rev}]?blobs=True   model info with siblings: size, blobId, lfs sha256
- GET /api/models/{repo}/tree/{rev}     tree listing with sizes and lfs oids
- GET|HEAD /{repo}/resolve/{rev}/{path} small files served directly (ETag = git blob id);
                                        LFS files redirected to /cdn/{sha256}, which honours Range

Knobs for tests: `drop_after[path] = n` serves n bytes of that file's body once and then
drops the connection; `corrupt[path] = bytes` serves other bytes than the listing
describes; `gated` repos answer 403 like the real hub. Every request is logged in
`requests` as (method, path, Range header); every body sent, in `served`.

Point huggingface-hub at it with HF_ENDPOINT=hub.url (and HF_HUB_DISABLE_XET=1,
HF_HUB_OFFLINE=0): `serve(monkeypatch)` does, for a test.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    tags: tuple[str, ...] = ()
    downloads: int = 0

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def sibling(self, path: str) -> dict:
        data = self.files[path]
        entry: dict = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
        if self.is_lfs(path):
            entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        return entry


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    corrupt: dict[str, bytes] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    served: list[tuple[str, str | None]] = field(default_factory=list)  # (file path, Range) of each body sent

    def add_repo(self, repo_id: str, files: dict[str, bytes], tags: tuple[str, ...] = (), downloads: int = 0) -> None:
        self.repos[repo_id] = FakeRepo(repo_id, files, tags=tags, downloads=downloads)

    def start(self) -> str:
        hub = self

        class Handler(_HubHandler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def serve(self, monkeypatch: Any) -> str:
        """`start`, with huggingface-hub pointed at this hub for the test: HF_ENDPOINT set, Xet off, online,
        no token of the user's."""
        monkeypatch.setenv("HF_ENDPOINT", self.start())
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        return self.url

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def ranges_for(self, file_path: str) -> list[str | None]:
        """The Range header of every GET that sent bytes of this file (redirects not counted)."""
        return [r for p, r in self.served if p == file_path]


class _HubHandler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.hub.requests.append((self.command, path, self.headers.get("Range")))
        query = parse_qs(url.query)
        if path == "/api/models":
            return self._search(query)
        if path.startswith("/api/models/"):
            return self._model_api(path.removeprefix("/api/models/"))
        if path.startswith("/cdn/"):
            return self._cdn(path.removeprefix("/cdn/"), head)
        if "/resolve/" in path:
            return self._resolve(path.lstrip("/"), head)
        return self._json(404, {"error": "not found"})

    def _search(self, query: dict) -> None:
        needle = (query.get("search") or [""])[0].lower()
        wanted_tag = (query.get("filter") or [None])[0]
        limit = int((query.get("limit") or ["50"])[0])
        hits = [
            {"id": r.repo_id, "downloads": r.downloads, "likes": 1, "tags": list(r.tags),
             "lastModified": "2026-01-02T03:04:05.000Z", "private": False}
            for r in self.hub.repos.values()
            if needle in r.repo_id.lower() and (wanted_tag is None or wanted_tag in r.tags)
        ]
        hits.sort(key=lambda h: -h["downloads"])
        self._json(200, hits[:limit])

    def _find_repo(self, rest: str) -> tuple[FakeRepo | None, str]:
        for repo_id, repo in self.hub.repos.items():
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return repo, rest[len(repo_id) :].lstrip("/")
        return None, rest

    def _repo_error(self, repo: FakeRepo | None) -> bool:
        if repo is None:
            self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return True
        if repo.repo_id in self.hub.gated:
            self._json(403, {"error": "Access to this model is restricted"}, {"X-Error-Code": "GatedRepo"})
            return True
        return False

    def _model_api(self, rest: str) -> None:
        repo, tail = self._find_repo(rest)
        if self._repo_error(repo):
            return
        assert repo is not None
        if tail.startswith("tree/"):
            tree = []
            for p in repo.files:
                s = repo.sibling(p)
                item = {"type": "file", "oid": s["blobId"], "size": s["size"], "path": p}
                if "lfs" in s:
                    item["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}
                tree.append(item)
            return self._json(200, tree)
        info = {"id": repo.repo_id, "sha": repo.sha, "private": False, "gated": False, "tags": list(repo.tags),
                "downloads": repo.downloads, "likes": 1,
                "siblings": [repo.sibling(p) for p in repo.files]}
        self._json(200, info)

    def _resolve(self, rest: str, head: bool) -> None:
        repo_part, _, file_part = rest.partition("/resolve/")
        repo = self.hub.repos.get(repo_part)
        if self._repo_error(repo):
            return
        assert repo is not None
        _revision, _, file_path = file_part.partition("/")
        if file_path not in repo.files:
            return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        data = repo.files[file_path]
        common = {"X-Repo-Commit": repo.sha}
        if repo.is_lfs(file_path):
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            for key, value in {**common, "Location": f"/cdn/{repo.repo_id}/{file_path}", "ETag": f'"{sha}"',
                               "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                               "Content-Length": "0"}.items():
                self.send_header(key, value)
            self.end_headers()
            return
        self._send_bytes(file_path, data, head, {**common, "ETag": f'"{git_blob_id(data)}"'})

    def _cdn(self, rest: str, head: bool) -> None:
        repo, file_path = self._find_repo(rest)
        if repo is None or file_path not in repo.files:
            return self._json(404, {"error": "not found"})
        data = self.hub.corrupt.get(file_path, repo.files[file_path])
        self._send_bytes(file_path, data, head, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'})

    def _send_bytes(self, file_path: str, data: bytes, head: bool, headers: dict[str, str]) -> None:
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start = int(first)
            end = min(int(last) + 1, len(data)) if last else len(data)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
            data_out = data[start:end]
        else:
            data_out = data
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data_out)), "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}.items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            return
        self.hub.served.append((file_path, wanted))
        drop = self.hub.drop_after.pop(file_path, None)
        if drop is not None:  # send part of the body, then drop the connection mid-transfer
            self.wfile.write(data_out[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(data_out)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in {**(headers or {}), "Content-Type": "application/json",
                           "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def make_tiny_gguf(path, vocab: int = 300, hidden: int = 64, layers: int = 2, context: int = 2048) -> bytes:
    """Write a small but real GGUF (llama shape, F32 and Q8_0 tensors) and return its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_context_length(context)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_token_list([f"tok{i}" for i in range(vocab)])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden), dtype=np.float32))
    for layer in range(layers):
        weight = rng.standard_normal((hidden, hidden), dtype=np.float32)
        quantized = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(f"blk.{layer}.attn_q.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "rb") as handle:
        return handle.read()
