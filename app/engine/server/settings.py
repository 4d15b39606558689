"""How the API server is configured: one frozen record, validated once."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11660


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: the OS picks a free port (tests, a second Studio instance)
    api_key: str | None = None  # when set, every endpoint but /health, /metrics and the docs requires it
    max_body_bytes: int = 32 * 1024 * 1024
    max_concurrent_requests: int = 256  # generation/embedding requests in flight; more get 429
    retry_after_seconds: int = 1  # sent with 429
    model_aliases: tuple[str, ...] = ()  # extra names clients may send in "model" for the loaded model
    embedding_model_aliases: tuple[str, ...] = ()
    default_max_tokens: int | None = None  # chat/responses without a limit: None fills the context
    cors_origins: tuple[str, ...] = ()
    enable_mcp: bool = True
    log_level: str = "warning"
    stream_keepalive_seconds: float = 5.0  # a ping on a stream that sent nothing for this long (prefill)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes}")
        if self.max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be at least 1, not {self.max_concurrent_requests}"
            )
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be at least 1, not {self.default_max_tokens}")
        if not self.stream_keepalive_seconds > 0:
            raise ValueError(f"stream_keepalive_seconds must be above 0, not {self.stream_keepalive_seconds}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank (leave it unset to disable authentication)")

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
