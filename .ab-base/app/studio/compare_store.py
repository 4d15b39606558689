"""The Compare pane's setup and its last results, kept across restarts in one JSON file.

What is kept: each column's kind, model and base URL (never its API key: keys live in the
keyring), the prompt and options, and the last run's results so they are on screen, and
savable, after a restart. A file that cannot be read is ignored (the defaults are used)
and replaced on the next save; it never stops the pane from opening.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.studio.compare import ColumnResult, CompareRequest, CompareResult

log = logging.getLogger(__name__)


@dataclass
class CompareSetup:
    columns: list[dict[str, str]]  # {"kind", "model", "base_url"}
    prompt: str = ""
    system_prompt: str = ""
    max_tokens: int = 256
    temperature: float = 0.7
    result: CompareResult | None = None

    def as_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "result"}
        data["result"] = self.result.as_dict() if self.result is not None else None
        return data


def load_setup(path: str | os.PathLike[str]) -> CompareSetup | None:
    """The saved setup, or None when there is none or it cannot be read (logged, not raised)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        columns = [{k: str(c.get(k, "")) for k in ("kind", "model", "base_url")} for c in data["columns"]]
        result = _result(data.get("result"))
        return CompareSetup(columns, str(data.get("prompt", "")), str(data.get("system_prompt", "")),
                            int(data.get("max_tokens", 256)), float(data.get("temperature", 0.7)), result)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("ignoring the saved Compare setup %s: %s", path, exc)
        return None


def save_setup(path: str | os.PathLike[str], setup: CompareSetup) -> None:
    """Write atomically (temp file + rename): a crash mid-save keeps the previous file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(setup.as_dict(), handle, indent=2, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _result(data: Any) -> CompareResult | None:
    if not data:
        return None
    request = CompareRequest(**{k: v for k, v in data["request"].items()
                                if k in CompareRequest.__dataclass_fields__})
    return CompareResult(request, [ColumnResult.from_dict(c) for c in data["columns"]], str(data["started_at"]))
