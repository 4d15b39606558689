"""The Studio's settings: each declared once, as data, and kept in one JSON file.

`SETTINGS` is the single declaration (key, default, kind, label, help, limits); the
settings UI is generated from it and every value is checked against it. The file is
flat JSON with the dotted keys, easy to edit by hand:

    {"engine.device": "cuda", "server.port": 8080}

A bad file never costs the user their settings: a value that fails its check is
reported in `Settings.problems`, the default is used in its place, and the raw value
is written back untouched on save until the user sets that key again. A file that is
not JSON at all is moved aside to `settings.json.broken` (never overwritten) before the
first save.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRETS_KEY = "secrets"  # plaintext fallback for API keys when no OS keyring works (see secrets.py)


class SettingsError(ValueError):
    """A setting's value or the settings file is wrong; the message names which and why."""


@dataclass(frozen=True)
class Setting:
    key: str
    default: Any
    kind: str  # "bool" | "int" | "float" | "str" | "path" | "choice"
    label: str
    help: str
    section: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def coerce(self, value: Any) -> Any:
        """The value converted to this setting's type, or SettingsError saying what is wrong."""
        try:
            converted = _CONVERTERS[self.kind](value)
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"{self.key}: {value!r} is not a valid {self.kind} ({exc})") from None
        if self.choices and converted not in self.choices:
            raise SettingsError(f"{self.key}: {value!r} is not one of {', '.join(self.choices)}")
        if self.minimum is not None and converted < self.minimum:
            raise SettingsError(f"{self.key}: {converted} is below the minimum {self.minimum:g}")
        if self.maximum is not None and converted > self.maximum:
            raise SettingsError(f"{self.key}: {converted} is above the maximum {self.maximum:g}")
        return converted


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    raise ValueError("expected true or false")


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("expected a whole number")
    return int(value.strip() if isinstance(value, str) else value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    return float(value.strip() if isinstance(value, str) else value)


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected text")
    return value


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "str": _to_str,
    "path": lambda value: str(Path(_to_str(value)).expanduser()) if value else "",
    "choice": _to_str,
}

SETTINGS: tuple[Setting, ...] = (
    Setting("models.folder", "", "path", "Models folder",
            "Where downloaded and imported models live. Empty: the default folder in your user data.", "Models"),
    Setting("models.default", "default", "str", "Model loaded at start",
            "A name in the models folder, a file path, or 'default' for the embedded Gemma 3 270M.", "Models"),
    Setting("hub.endpoint", "", "str", "Hugging Face endpoint",
            "Empty: $HF_ENDPOINT or https://huggingface.co. Set for a mirror.", "Models"),
    Setting("engine.device", "auto", "choice", "Device",
            "auto uses the NVIDIA GPU when one is usable, else the CPU.", "Engine", ("auto", "cpu", "cuda")),
    Setting("engine.context_length", 8192, "int", "Context length",
            "Tokens per conversation (question and answer together), capped at the model's own maximum; "
            "will-it-fit verdicts are taken at this length. 0: the model's maximum, capped by what fits in "
            "memory.", "Engine", minimum=0, maximum=10_000_000),
    Setting("engine.remote_url", "", "str", "Remote engine",
            "An OpenAI-compatible server (vLLM, SGLang, another Paddock) that answers Chat, Documents and "
            "Transcribe instead of the engine inside the Studio, e.g. http://gpu-box:8000/v1. Its API key goes "
            "under Keys. Empty: the engine inside the Studio. Applies at the next start.", "Engine"),
    Setting("engine.remote_model", "", "str", "Remote model",
            "The chat model to use on the remote engine. Empty: the first chat model it lists.", "Engine"),
    Setting("engine.kv_dtype", "auto", "choice", "KV cache precision",
            "auto: float16 on the GPU, float32 on the CPU. fp8 halves KV memory at a small quality cost.",
            "Engine", ("auto", "float16", "fp8", "float32")),
    Setting("engine.prefix_cache", True, "bool", "Prefix cache",
            "Reuse the work done on prompt beginnings seen before (agents resend long prompts every turn). "
            "Off: every prompt is computed in full. Applies when a model is loaded.", "Server"),
    Setting("engine.gpu_memory_utilization", 0.90, "float", "GPU memory share",
            "Fraction of the GPU's free memory the engine may take.", "Engine", minimum=0.05, maximum=1.0),
    Setting("engine.max_num_seqs", 32, "int", "Parallel requests",
            "Requests decoded together.", "Engine", minimum=1, maximum=4096),
    Setting("chat.system_prompt", "", "str", "System prompt", "Sent first in every new conversation.", "Chat"),
    Setting("chat.temperature", 0.7, "float", "Temperature", "0 picks the likeliest token every time.", "Chat",
            minimum=0.0, maximum=2.0),
    Setting("chat.top_p", 0.95, "float", "Top p", "Sample only from the smallest set of tokens with this much "
            "probability.", "Chat", minimum=0.01, maximum=1.0),
    Setting("chat.max_tokens", 1024, "int", "Max answer tokens", "Longest answer, in tokens.", "Chat",
            minimum=1, maximum=1_000_000),
    Setting("chat.enter_sends", True, "bool", "Enter sends",
            "On: Enter sends and Shift+Enter starts a new line. Off: Ctrl+Enter sends.", "Chat"),
    Setting("compare.openrouter_base_url", "https://openrouter.ai/api/v1", "str", "OpenRouter base URL",
            "Where OpenRouter targets send requests.", "Compare"),
    Setting("compare.timeout_s", 120.0, "float", "Request timeout (s)",
            "A column gives up after this long without an answer.", "Compare", minimum=1.0, maximum=3600.0),
    Setting("server.port", 11660, "int", "API port", "Port of the local OpenAI/Anthropic-compatible API.",
            "Server", minimum=1, maximum=65535),
    Setting("server.bind", "loopback", "choice", "Listen on",
            "loopback: this computer only. lan: other machines on your network too.", "Server",
            ("loopback", "lan")),
    Setting("server.require_api_key", False, "bool", "Require an API key",
            "Clients must send the key set under Server. Recommended with lan.", "Server"),
    Setting("documents.embedding_model", "", "path", "Embedding model",
            "Embeds the Documents pane's files and questions: a Qwen3-Embedding folder or .gguf, or a "
            "sentence-transformers folder. Empty: the built-in all-MiniLM-L6-v2. Applies at the next start; "
            "documents embedded by another model are read again.", "Documents"),
    Setting("documents.ocr_model", "", "path", "OCR model",
            "Reads the pages of scanned PDFs (no text layer) as they are added: a PaddleOCR-VL folder, or its "
            ".gguf with the mmproj beside it. Empty: a PaddleOCR-VL in the models folder, if there is one; else "
            "scanned pages are left to a vision model. Applies at the next start.", "Documents"),
    Setting("transcribe.model", "", "path", "Transcription model",
            "The Transcribe pane's model: a CTranslate2 Whisper folder, or a speech LLM (Qwen3-ASR, Granite Speech, "
            "Gemma 4 with audio: its folder, or its GGUF with the mmproj beside it), which runs as a second engine "
            "beside the chat model and is counted in will-it-fit. Empty: the built-in Whisper tiny.en. Choosing a "
            "model in the pane sets it; changed here, it applies at the next start.", "Transcribe"),
    Setting("appearance.theme", "system", "choice", "Theme", "Colours of the window.", "Appearance",
            ("system", "light", "dark")),
)

SETTINGS_BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def declaration(key: str) -> Setting:
    try:
        return SETTINGS_BY_KEY[key]
    except KeyError:
        raise SettingsError(f"unknown setting {key!r}; known: {', '.join(SETTINGS_BY_KEY)}") from None


class Settings:
    """Current values backed by a JSON file. `set` checks; `save` writes atomically."""

    def __init__(self, path: Path, raw: dict[str, Any] | None = None, file_is_broken: bool = False) -> None:
        self.path = Path(path)
        self._raw: dict[str, Any] = dict(raw or {})  # what the file held, unknown keys included
        self._values: dict[str, Any] = {}
        self._file_is_broken = file_is_broken
        self._listeners: list[Callable[[str, Any], None]] = []
        self.file_problem: str | None = None
        self._value_problems: dict[str, str] = {}
        for setting in SETTINGS:
            if setting.key not in self._raw:
                continue
            try:
                self._values[setting.key] = setting.coerce(self._raw[setting.key])
            except SettingsError as exc:
                self._value_problems[setting.key] = f"{self.path.name}: {exc}; using the default {setting.default!r}"

    @classmethod
    def load(cls, path: str | os.PathLike[str], strict: bool = False) -> Settings:
        """Read the file (missing: all defaults). Problems go to `.problems`, or raise when `strict`."""
        path = Path(path)
        raw, broken, problem = _read_json_object(path)
        settings = cls(path, raw, file_is_broken=broken)
        settings.file_problem = problem
        if strict and settings.problems:
            raise SettingsError("; ".join(settings.problems))
        return settings

    @property
    def problems(self) -> list[str]:
        """What was wrong with the file as loaded, for the UI to show; empty when all is well."""
        return ([self.file_problem] if self.file_problem else []) + list(self._value_problems.values())

    def get(self, key: str) -> Any:
        return self._values.get(key, declaration(key).default)

    __getitem__ = get

    def set(self, key: str, value: Any) -> None:
        self.update({key: value})

    def update(self, changes: Mapping[str, Any]) -> None:
        """Check every change first, then apply them all: one bad value changes nothing."""
        checked = {key: declaration(key).coerce(value) for key, value in changes.items()}
        for key, value in checked.items():
            self._values[key] = value
            self._raw[key] = value
            self._value_problems.pop(key, None)
        for key, value in checked.items():
            for listener in list(self._listeners):
                listener(key, value)

    def reset(self, keys: Iterable[str] | None = None) -> None:
        """Back to the declared defaults (all settings when `keys` is None)."""
        for key in list(keys) if keys is not None else list(SETTINGS_BY_KEY):
            self.set(key, declaration(key).default)

    def subscribe(self, listener: Callable[[str, Any], None]) -> Callable[[], None]:
        """Call `listener(key, value)` after each change; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def as_dict(self) -> dict[str, Any]:
        return {s.key: self.get(s.key) for s in SETTINGS}

    # Plaintext secrets: only used by secrets.SecretStore when no OS keyring works.
    def plaintext_secret(self, name: str) -> str | None:
        secrets = self._raw.get(SECRETS_KEY)
        return secrets.get(name) if isinstance(secrets, dict) else None

    def set_plaintext_secret(self, name: str, value: str | None) -> None:
        secrets = self._raw.get(SECRETS_KEY)
        secrets = dict(secrets) if isinstance(secrets, dict) else {}
        if value is None:
            secrets.pop(name, None)
        else:
            secrets[name] = value
        if secrets:
            self._raw[SECRETS_KEY] = secrets
        else:
            self._raw.pop(SECRETS_KEY, None)

    def save(self) -> None:
        """Write atomically (temp file + rename); a file that was not JSON is first kept aside."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._file_is_broken and self.path.exists():
            self.path.rename(_free_name(self.path.with_name(self.path.name + ".broken")))
            self._file_is_broken = False
        text = json.dumps(self._raw, indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=self.path.name, suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)  # it may hold plaintext API keys
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _read_json_object(path: Path) -> tuple[dict[str, Any], bool, str | None]:
    """(values, file is broken, problem) for the settings file at `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, False, None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read the settings file {path}: {exc}") from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        return {}, True, (
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); using defaults. "
            f"The file will be kept as {path.name}.broken when settings are next saved."
        )
    if not isinstance(data, dict):
        return {}, True, f"{path} must hold a JSON object, not {type(data).__name__}; using defaults."
    return data, False, None


def _free_name(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{n}")
        n += 1
    return candidate
