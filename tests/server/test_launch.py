"""ServerHandle starts and stops uvicorn in-process; settings are validated; exposure is warned about."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from app.engine.server.launch import ServerHandle, warn_if_exposed
from app.engine.server.settings import ServerSettings


def port_accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_start_returns_listening_and_stop_returns_closed(engine):
    handle = ServerHandle(engine, settings=ServerSettings(port=0))
    handle.start()
    port = handle.port
    assert handle.running and port_accepts(port)
    assert httpx.get(f"{handle.base_url}/health").status_code == 200
    handle.stop()
    assert not handle.running and not port_accepts(port)
    handle.start()  # the Studio toggles the API on again: a fresh app on a fresh port
    try:
        assert httpx.get(f"{handle.base_url}/v1/models").status_code == 200
    finally:
        handle.stop()


def test_starting_twice_or_on_a_taken_port_fails_clearly(engine):
    with ServerHandle(engine, settings=ServerSettings(port=0)) as handle:
        with pytest.raises(RuntimeError, match="already running"):
            handle.start()
        taken = ServerHandle(engine, settings=ServerSettings(port=handle.port))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{handle.port}"):
            taken.start()


def test_exposed_host_without_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="app.engine.server.launch"):
        assert warn_if_exposed(ServerSettings(host="0.0.0.0")) is True
    assert "without an API key" in caplog.text
    assert warn_if_exposed(ServerSettings(host="0.0.0.0", api_key="k")) is False
    assert warn_if_exposed(ServerSettings(host="127.0.0.1")) is False
    assert warn_if_exposed(ServerSettings(host="::1")) is False


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("port", 70000, "port"),
        ("max_body_bytes", 10, "max_body_bytes"),
        ("max_concurrent_requests", 0, "max_concurrent_requests"),
        ("api_key", "  ", "api_key"),
    ],
)
def test_settings_reject_bad_values_by_name(field, value, words):
    with pytest.raises(ValueError, match=words):
        ServerSettings(**{field: value})
