"""`paddock models`: the local models folder, and downloads from the Hugging Face hub.

    paddock models                      list the models folder with metadata
    paddock models search QUERY         search the hub (--gguf: only repos with GGUF files)
    paddock models files REPO           a repo's files with sizes, before downloading
    paddock models download REPO [FILE ...]   download (resumes an interrupted download)
    paddock models delete NAME          delete a model from the folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "list, search, download and delete models (local folder and Hugging Face hub)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    sub.add_parser("list", help="list the models folder (the default)")
    search = sub.add_parser("search", help="search the Hugging Face hub")
    search.add_argument("query")
    search.add_argument("--gguf", action="store_true", help="only repos with GGUF files")
    search.add_argument("--limit", type=int, default=20)
    files = sub.add_parser("files", help="a hub repo's files with their sizes")
    files.add_argument("repo")
    download = sub.add_parser("download", help="download a repo's model files into the models folder")
    download.add_argument("repo", help="owner/name on the Hugging Face hub")
    download.add_argument("files", nargs="*", help="files to fetch (default: the model's files; GGUF repos: "
                                                   "required when there are several)")
    delete = sub.add_parser("delete", help="delete a model from the models folder")
    delete.add_argument("name")


def run(args: argparse.Namespace) -> int:
    from app.studio.downloads import DownloadError
    from app.studio.settings import SettingsError

    action = args.models_command or "list"
    try:
        return {"list": _list, "search": _search, "files": _files, "download": _download, "delete": _delete}[
            action
        ](args)
    except (DownloadError, SettingsError, KeyError, ValueError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"paddock models: {message}", file=sys.stderr)
        return 1


def models_dir() -> Path:
    from app.studio.library import default_models_dir

    return default_models_dir()


def hub_client():  # -> HubClient, with the user's endpoint setting and token
    from app.studio.downloads import HubClient
    from app.studio.paths import studio_paths
    from app.studio.secrets import HF_TOKEN, SecretStore
    from app.studio.settings import Settings

    settings = Settings.load(studio_paths().settings_file)
    return HubClient(endpoint=settings.get("hub.endpoint") or None, token=SecretStore(settings).get(HF_TOKEN))


def _list(args: argparse.Namespace) -> int:
    from app.engine.plan.fit import format_bytes
    from app.studio.library import ModelLibrary

    folder = models_dir()
    entries = ModelLibrary(folder).list()
    print(f"Models folder: {folder}")
    if not entries:
        print("(empty: `paddock models download OWNER/REPO` fetches one)")
        return 0
    rows = [("NAME", "FORMAT", "ARCH", "PARAMS", "QUANT", "CONTEXT", "SIZE")]
    for e in entries:
        if e.error and e.architecture is None:
            rows.append((e.name, e.format, "?", "?", "?", "?", f"{format_bytes(e.size_bytes)}  ({e.error})"))
            continue
        rows.append((e.name, e.format, e.architecture or "?", _count(e.parameters), e.quantization or "?",
                     str(e.context_length or "?"), format_bytes(e.size_bytes)))
    _print_table(rows)
    return 0


def _search(args: argparse.Namespace) -> int:
    hits = hub_client().search(args.query, limit=args.limit, gguf_only=args.gguf)
    rows = [("REPO", "DOWNLOADS", "LIKES", "GGUF")]
    rows += [(h.repo_id, str(h.downloads), str(h.likes), "yes" if h.has_gguf else "") for h in hits]
    _print_table(rows)
    return 0


def _files(args: argparse.Namespace) -> int:
    from app.engine.plan.fit import format_bytes

    listing = hub_client().list_files(args.repo)
    _print_table([("FILE", "SIZE", "CHECKSUM")] + [
        (f.path, format_bytes(f.size), f"sha256 {f.sha256[:12]}…" if f.sha256 else "git") for f in listing.files
    ])
    return 0


def _download(args: argparse.Namespace) -> int:
    from app.engine.plan.fit import format_bytes
    from app.studio.tasks import CancelToken, Progress

    client = hub_client()
    listing = client.list_files(args.repo)
    chosen = [f for name in args.files for f in listing.files_for(name)] or listing.default_selection()
    if not chosen and listing.only_gguf_model() is not None:
        chosen = listing.files_for(listing.only_gguf_model().path)
    if not chosen:
        names = "\n  ".join(f"{f.path} ({format_bytes(f.size)})" for f in listing.gguf_models)
        raise ValueError(f"{args.repo} holds several GGUF models; name the one to download:\n  {names}")
    total = sum(f.size for f in chosen)
    print(f"Downloading {len(chosen)} file(s), {format_bytes(total)}, into {models_dir()}", file=sys.stderr)

    def show(progress: Progress) -> None:
        percent = 100 * (progress.fraction or 0)
        print(f"\r{percent:5.1f}%  {format_bytes(int(progress.done))} / {format_bytes(total)}  {progress.message}",
              end="", file=sys.stderr, flush=True)

    try:
        paths = client.download(listing, chosen, models_dir(), progress=show, token=CancelToken())
    except KeyboardInterrupt:
        print("\nPaused: run the same command again to resume.", file=sys.stderr)
        return 130
    print(file=sys.stderr)
    for path in paths:
        print(path)
    return 0


def _delete(args: argparse.Namespace) -> int:
    from app.studio.library import ModelLibrary

    library = ModelLibrary(models_dir())
    entry = library.find(args.name)
    library.delete(entry)
    print(f"Deleted {entry.name}")
    return 0


def _count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
