"""How the API server is configured: one frozen record, validated once."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11660
MIB = 1024 * 1024
# OpenAI stops at 25 MB; a local server takes long recordings: an hour of 16 kHz 16-bit mono WAV is 115 MB.
DEFAULT_MAX_AUDIO_BODY_BYTES = 200 * MIB
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: the OS picks a free port (tests, a second Studio instance)
    api_key: str | None = None  # when set, every endpoint but /health requires it
    max_body_bytes: int = 32 * MIB  # JSON bodies; more get 413 (counted as the bytes arrive)
    max_audio_body_bytes: int = DEFAULT_MAX_AUDIO_BODY_BYTES  # /v1/audio/transcriptions uploads
    max_audio_seconds: int = 2 * 3600  # longer audio is refused before Whisper runs (400)
    max_images: int = 16  # image parts of one request; more get 400
    max_image_bytes: int = 20 * MIB  # one image, decoded from its base64; more get 400
    allow_image_urls: bool = False  # fetch http(s) image URLs (off: only inline data: URLs / base64)
    max_concurrent_uploads: int = 2  # transcriptions in flight; more get 429
    max_concurrent_requests: int = 256  # generation/embedding requests in flight; more get 429
    max_choices: int = 16  # `n` of one chat or completions request
    max_prompts: int = 64  # prompts in one completions request's list
    max_generations: int = 256  # n x prompts of one request
    prompt_workers: int = 4  # threads rendering templates and tokenizing, off the event loop
    retry_after_seconds: int = 1  # sent with 429
    # slow clients (admission.py, http_protocol.py): past these the client gets 408 and the connection closes
    header_timeout_seconds: float = 10.0  # request line and headers, from the connection's first byte
    body_timeout_seconds: float = 60.0  # a JSON body, whole, from its headers
    upload_timeout_seconds: float = 600.0  # an audio upload, whole (200 MB at 2.7 Mbit/s)
    model_aliases: tuple[str, ...] = ()  # extra names clients may send in "model" for the loaded model
    embedding_model_aliases: tuple[str, ...] = ()
    default_max_tokens: int | None = None  # chat/responses without a limit: None fills the context
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (CORS and the Origin check)
    allowed_hosts: tuple[str, ...] = ()  # Host header values accepted beside the bound address and loopback
    enable_mcp: bool = True
    log_level: str = "warning"
    stream_keepalive_seconds: float = 5.0  # a ping on a stream that sent nothing for this long (prefill)
    # chat turns whose sampled ids a next turn may reuse where its text repeats them (turn_memory.py); 0: off
    remembered_turns: int = 64
    # drop lines a client changes on every request from system prompts (volatile_parts.py: Claude Code's
    # x-anthropic-billing-header), so the prefix cache hits past them; False keeps the prompt as sent
    strip_volatile_metadata: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        minimums = {"max_body_bytes": 1024, "max_audio_body_bytes": 1024}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name.startswith(("max_", "prompt_")) and isinstance(value, int):
                least = minimums.get(field.name, 1)
                if value < least:
                    raise ValueError(f"{field.name} must be at least {least}, not {value}")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be at least 1, not {self.default_max_tokens}")
        if self.remembered_turns < 0:
            raise ValueError(f"remembered_turns must not be negative, not {self.remembered_turns}")
        for name in ("stream_keepalive_seconds", "header_timeout_seconds", "body_timeout_seconds",
                     "upload_timeout_seconds"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0, not {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank (leave it unset to disable authentication)")

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def is_wildcard(self) -> bool:
        """Bound to every interface (0.0.0.0, ::): clients may use any of the machine's names."""
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_unspecified
        except ValueError:
            return False

    def host_names(self) -> tuple[str, ...]:
        """The Host header names this server answers to (each with any port), for DNS-rebinding checks."""
        bound = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return tuple(dict.fromkeys([*LOOPBACK_NAMES, bound, *self.allowed_hosts]))


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
