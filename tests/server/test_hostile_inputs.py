"""Issue 24's hostile inputs, replayed against a live server: each gets a 4xx in the protocol's own
error shape naming what was wrong, `/health` stays responsive, and a normal request works after it."""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT, wait_until

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
HI = [{"role": "user", "content": "hi"}]
# /health answers within 100 ms (issue 24's acceptance line) while the server works on a hostile request:
# the median is held to that line; the slowest answer gets a margin that survives a loaded 2-core
# machine (the shared one ran at load 127) and still fails a loop blocked for tens of seconds, as it was.
HEALTH_TYPICAL_S = 0.1
HEALTH_WORST_S = 2.0
# a model on a heavily shared CPU can take tens of seconds for a few tokens: this bounds a hang, not speed
PATIENT = httpx.Timeout(300)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": HI, "max_tokens": 4, **fields}


def completion(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 4, **fields}


def message(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": HI, "max_tokens": 4, **fields}


def tool(description: str = "d", parameters: Any = None) -> dict[str, Any]:
    function = {"name": "f", "description": description, "parameters": parameters or {"type": "object"}}
    return {"type": "function", "function": function}


def assistant_call(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        *HI,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "user", "content": "go"},
    ]


# (path, body from the model name, the field the error must name)
CASES: dict[str, tuple[str, Callable[[str], dict[str, Any]], str]] = {
    "seed -2": (CHAT, lambda m: chat(m, seed=-2), "seed"),
    "seed below -2^63": (CHAT, lambda m: chat(m, seed=-(2**63) - 1), "seed"),
    "seed 2^64": (COMPLETIONS, lambda m: completion(m, seed=2**64), "seed"),
    "stop_token_ids far negative": (
        CHAT,
        lambda m: chat(m, stop_token_ids=[-1_000_000_000_000], min_tokens=1),
        "stop_token_ids",
    ),
    "stop_token_ids past the vocabulary": (
        COMPLETIONS,
        lambda m: completion(m, stop_token_ids=[10**9], min_tokens=1),
        "stop_token_ids",
    ),
    "too many stop_token_ids": (CHAT, lambda m: chat(m, stop_token_ids=list(range(257))), "stop_token_ids"),
    "too many stop strings": (CHAT, lambda m: chat(m, stop=[f"s{i}" for i in range(33)]), "stop"),
    "stop strings too long": (COMPLETIONS, lambda m: completion(m, stop=["x" * 9000, "y" * 9000]), "stop"),
    "anthropic stop_sequences too long": (
        MESSAGES,
        lambda m: message(m, stop_sequences=["x" * 20_000]),
        "stop_sequences",
    ),
    "logit_bias entries": (CHAT, lambda m: chat(m, logit_bias={str(i): 1 for i in range(301)}), "logit_bias"),
    "n over the cap": (CHAT, lambda m: chat(m, n=17), "n"),
    "prompt list over the cap": (COMPLETIONS, lambda m: completion(m, prompt=["p"] * 65), "prompt"),
    "n x prompts over the cap": (COMPLETIONS, lambda m: completion(m, prompt=["p"] * 17, n=16), "n"),
    "too many messages": (CHAT, lambda m: chat(m, messages=HI * 10_001), "messages"),
    "too many tools": (CHAT, lambda m: chat(m, tools=[tool()] * 257), "tools"),
    "tool schema too deep": (CHAT, lambda m: chat(m, tools=[tool(parameters=nested(100))]), "tools"),
    "tool schema too large": (
        CHAT,
        lambda m: chat(m, tools=[tool(parameters={"enum": list(range(25_000))})]),
        "tools",
    ),
    "anthropic tool schema too deep": (
        MESSAGES,
        lambda m: message(m, tools=[{"name": "f", "input_schema": nested(100)}]),
        "tools",
    ),
    "tool_call arguments nested 5,000 deep": (
        CHAT,
        lambda m: chat(m, messages=assistant_call("[" * 5000 + "]" * 5000)),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "anthropic tool_use input too deep": (
        MESSAGES,
        lambda m: message(
            m,
            messages=[
                *HI,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": nested(100)}],
                },
            ],
        ),
        "messages",
    ),
    "surrogate in a tool description": (CHAT, lambda m: chat(m, tools=[tool("a\ud800b")]), "tools"),
    "anthropic surrogate in a tool description": (
        MESSAGES,
        lambda m: message(m, tools=[{"name": "f", "description": "\udfff"}]),
        "tools",
    ),
    "surrogate in chat_template_kwargs": (
        CHAT,
        lambda m: chat(m, chat_template_kwargs={"x": ["\ud800"]}),
        "chat_template_kwargs",
    ),
    "surrogate in a chat_template_kwargs key": (
        "/tokenize",
        lambda m: {"messages": HI, "chat_template_kwargs": {"\ud800": 1}},
        "chat_template_kwargs",
    ),
    "surrogate in content": (
        CHAT,
        lambda m: chat(m, messages=[{"role": "user", "content": "\ud800"}]),
        "messages",
    ),
    "anthropic surrogate in system": (MESSAGES, lambda m: message(m, system="\udc00"), "system"),
    "temperature Infinity": (CHAT, lambda m: chat(m, temperature=float("inf")), "temperature"),
    "top_p NaN": (COMPLETIONS, lambda m: completion(m, top_p=float("nan")), "top_p"),
    "anthropic temperature Infinity": (
        MESSAGES,
        lambda m: message(m, temperature=float("inf")),
        "temperature",
    ),
    "responses temperature Infinity": (
        "/v1/responses",
        lambda m: {"model": m, "input": "hi", "temperature": float("inf")},
        "temperature",
    ),
    "tool_choice required with a self-referencing schema": (
        CHAT,
        lambda m: chat(m, tools=[tool(parameters={"$ref": "#"})], tool_choice="required"),
        "tools",
    ),
    "anthropic tool_choice any with a self-referencing schema": (
        MESSAGES,
        lambda m: message(
            m, tools=[{"name": "f", "input_schema": {"$ref": "#"}}], tool_choice={"type": "any"}
        ),
        "finite value",
    ),
    "tool_choice required without tools": (CHAT, lambda m: chat(m, tool_choice="required"), "tool_choice"),
    "responses tool_choice required without tools": (
        "/v1/responses",
        lambda m: {"model": m, "input": "hi", "tool_choice": "required"},
        "tool_choice",
    ),
    "surrogate in a completions prompt": (
        COMPLETIONS,
        lambda m: completion(m, prompt=["ok", "\ud800"]),
        "prompt",
    ),
}


def post_raw(http: httpx.Client, path: str, body: Any) -> httpx.Response:
    """JSON with \\u escapes for every non-ASCII character, so lone surrogates travel as JSON allows."""
    content = json.dumps(body, ensure_ascii=True)
    return http.post(path, content=content, headers={"content-type": "application/json"})


def error_of(response: httpx.Response, path: str) -> tuple[str, str | None]:
    """(message, param) from the protocol's error shape, which is asserted exactly."""
    body = response.json()
    if path.startswith(MESSAGES):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return body["error"]["message"], None
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"], body["error"]["param"]


def assert_refused(response: httpx.Response, path: str, status: int, field: str) -> str:
    assert response.status_code == status, response.text[:500]
    message, param = error_of(response, path)
    assert field in message or (param is not None and param.startswith(field)), (field, message, param)
    return message


@contextmanager
def health_probe(base_url: str) -> Iterator[list[float]]:
    """Polls /health from another thread while the block runs; yields the list of latencies (seconds)."""
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=base_url, timeout=CLIENT_TIMEOUT) as client:
            while not stop.is_set():
                began = time.perf_counter()
                assert client.get("/health").status_code == 200
                latencies.append(time.perf_counter() - began)
                time.sleep(0.005)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join()


@pytest.fixture(autouse=True)
def healthy_afterwards(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on a server: /health answers and a normal request works. Taken through `request`
    so that a test without an engine is not run once per engine, and skipped where the test skips
    itself on the real engine (`scripted`): each request on the embedded model costs about a CPU-second."""
    if "engine" not in request.fixturenames:
        yield
        return
    engine = request.getfixturevalue("engine")
    if "scripted" in request.fixturenames and not isinstance(engine, FakeEngine):
        yield
        return
    http: httpx.Client = request.getfixturevalue("http")
    model_name: str = request.getfixturevalue("model_name")
    yield
    assert http.get("/health").status_code == 200
    normal = http.post(CHAT, json=chat(model_name, max_tokens=1), timeout=PATIENT)  # one token shows it
    assert normal.status_code == 200, normal.text
    assert normal.json()["usage"]["completion_tokens"] >= 1


# The cases whose refusal may depend on the real model (its vocabulary, its chat template) also run on the
# embedded engine in `make test-fast`; the others are refused by the server alone, which the fake's run shows.
REAL_MODEL_CASES = ("stop_token_ids past the vocabulary", "surrogate in chat_template_kwargs",
                    "tool_call arguments nested 5,000 deep")  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        case if case in REAL_MODEL_CASES else pytest.param(case, marks=pytest.mark.slow_on_embedded)
        for case in CASES
    ],
)
def test_hostile_field_is_refused_naming_it(http, model_name, case):
    path, body, field = CASES[case]
    assert_refused(post_raw(http, path, body(model_name)), path, 400, field)


def test_seed_minus_one_means_random_and_the_top_seed_is_accepted(http, model_name):
    for seed in (-1, 2**64 - 1):
        response = http.post(CHAT, json=chat(model_name, seed=seed, n=2, temperature=1.0))
        assert response.status_code == 200, response.text


def test_a_body_nested_beyond_the_parser_is_400(http, model_name):
    deep = "[" * 100_000 + "]" * 100_000
    content = f'{{"model": "{model_name}", "messages": {deep}}}'
    response = http.post(CHAT, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400 and error_of(response, CHAT)[0]


HUGE = "x " * (15 * 1024 * 1024)  # 30 MB of text: far past any context


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (CHAT, lambda m: chat(m, messages=[{"role": "user", "content": HUGE}]), "messages"),
        (COMPLETIONS, lambda m: completion(m, prompt=HUGE), "prompt"),
        (MESSAGES, lambda m: message(m, messages=[{"role": "user", "content": HUGE}]), "messages"),
        ("/tokenize", lambda m: {"prompt": HUGE}, "prompt"),
    ],
    ids=["chat", "completions", "messages", "tokenize"],
)
def test_a_30mb_prompt_is_refused_before_tokenizing_while_health_answers(
    server, http, model_name, path, body, field
):
    payload = json.dumps(body(model_name))
    with health_probe(server.base_url) as latencies:
        time.sleep(0.05)  # the probe is polling before the body goes out
        response = http.post(path, content=payload, headers={"content-type": "application/json"})
        time.sleep(0.05)
    message = assert_refused(response, path, 400, field)
    assert "refused before tokenizing" in message
    assert latencies and statistics.median(latencies) < HEALTH_TYPICAL_S, sorted(latencies)
    assert max(latencies) < HEALTH_WORST_S, sorted(latencies)[-5:]


# ---- what a web page could send -----------------------------------------------------------------

API_ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("POST", CHAT, "chat"),
    ("POST", COMPLETIONS, "completion"),
    ("POST", "/v1/responses", "responses"),
    ("POST", MESSAGES, "message"),
    ("POST", "/v1/messages/count_tokens", "message"),
    ("POST", "/v1/embeddings", "embeddings"),
    ("POST", "/tokenize", "tokenize"),
    ("POST", "/detokenize", "detokenize"),
    ("POST", "/v1/rerank", "rerank"),
    ("POST", "/mcp", "mcp"),
]
BODIES: dict[str, Callable[[str], dict[str, Any]]] = {
    "chat": chat,
    "completion": completion,
    "message": message,
    "responses": lambda m: {"model": m, "input": "hi", "max_output_tokens": 4},
    "embeddings": lambda m: {"model": "fake-embed", "input": "hi"},
    "tokenize": lambda m: {"prompt": "hi"},
    "detokenize": lambda m: {"tokens": [20, 21]},
    "rerank": lambda m: {"query": "q", "documents": ["a"]},
    "mcp": lambda m: {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
}


def send(
    http: httpx.Client, method: str, path: str, kind: str | None, model: str, **headers: str
) -> httpx.Response:
    if kind is None:
        return http.request(method, path, headers=headers, timeout=PATIENT)
    all_headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        **headers,
    }
    content = json.dumps(BODIES[kind](model))
    return http.request(method, path, content=content, headers=all_headers, timeout=PATIENT)


@pytest.mark.slow_on_embedded  # host, origin and content-type checks come before any engine work
@pytest.mark.parametrize(("method", "path", "kind"), API_ROUTES, ids=[p for _, p, _ in API_ROUTES])
def test_a_browser_style_request_is_refused_on_every_route(http, model_name, method, path, kind):
    assert send(http, method, path, kind, model_name).status_code == 200
    rebinding = send(http, method, path, kind, model_name, host="evil.example:11660")
    assert rebinding.status_code == 421 and "evil.example" in error_of(rebinding, path)[0]
    foreign = send(http, method, path, kind, model_name, origin="https://evil.example")
    assert foreign.status_code == 403 and "evil.example" in error_of(foreign, path)[0]
    # a page on another port of this machine (a dev server) is another origin, as browsers count them
    for other_port in ("http://localhost:3000", "http://127.0.0.1:3000", "http://localhost"):
        local_page = send(http, method, path, kind, model_name, origin=other_port)
        assert local_page.status_code == 403 and other_port in error_of(local_page, path)[0]
    own = send(http, method, path, kind, model_name, origin=str(http.base_url).rstrip("/"))
    assert own.status_code == 200, own.text[:300]
    assert error_type(rebinding, path) == "invalid_request_error"  # the client's fault, not the server's
    if kind is not None:
        as_text = send(http, method, path, kind, model_name, **{"content-type": "text/plain"})
        assert as_text.status_code == 415 and "text/plain" in error_of(as_text, path)[0]
        assert error_type(as_text, path) == "invalid_request_error"


def error_type(response: httpx.Response, path: str) -> str:
    return response.json()["error"]["type"]


def test_a_multipart_upload_from_another_local_page_is_refused():
    """A form upload is a "simple" request: the browser sends it without a preflight, so the Origin
    check alone stops it; the server's own page (same host and port) reaches the route."""
    from .test_audio_transcriptions import audio_server

    with audio_server(None) as server, httpx.Client(base_url=server.base_url) as http:
        files = {"file": ("a.wav", b"", "audio/wav")}
        data = {"model": "whisper-1"}
        foreign = http.post(
            TRANSCRIPTIONS, files=files, data=data, headers={"origin": "http://localhost:3000"}
        )
        assert foreign.status_code == 403 and "localhost:3000" in foreign.json()["error"]["message"]
        own = http.post(TRANSCRIPTIONS, files=files, data=data, headers={"origin": server.base_url})
        assert own.status_code == 404 and "transcription" in own.json()["error"]["message"]  # no model here


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, "localhost:8000", True),
        ("http://localhost:8000", "localhost:8000", True),
        ("https://localhost:8000", "localhost:8000", True),
        ("http://localhost", "localhost:80", True),
        ("http://localhost:80", "localhost", True),
        ("http://LOCALHOST:8000", "localhost:8000", True),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("http://localhost:3000", "localhost:8000", False),
        ("http://127.0.0.1:8000", "localhost:8000", False),
        ("http://localhost:8000", None, False),
        ("null", "localhost:8000", False),
        ("file://", "localhost:8000", False),
        ("http://localhost:x", "localhost:8000", False),
        ("http://[::1:8000", "localhost:8000", False),
        ("http://localhost:8000/path", "localhost:8000", False),
        ("https://app.example", "localhost:8000", True),  # configured with --cors-origin
    ],
)
def test_the_origin_rule_accepts_only_the_servers_own_and_configured_ones(origin, host, allowed):
    from app.engine.server.middleware import is_own_or_allowed_origin

    assert is_own_or_allowed_origin(origin, host, {"https://app.example"}) is allowed


def test_an_allowed_origin_gets_cors_and_its_requests(engine, model_name):
    origin = "https://app.example"
    with (
        running_server(engine, cors_origins=(origin,)) as server,
        httpx.Client(base_url=server.base_url) as http,
    ):
        preflight = http.options(CHAT, headers={"origin": origin, "access-control-request-method": "POST"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        assert (
            http.post(CHAT, json=chat(model_name), headers={"origin": origin}, timeout=PATIENT).status_code
            == 200
        )
        other = http.post(CHAT, json=chat(model_name), headers={"origin": "https://other.example"})
        assert other.status_code == 403


@pytest.mark.slow_on_embedded  # the key is checked before any engine work: 14 real requests for nothing more
def test_the_api_key_guards_every_route_but_health(engine, embedder, model_name):
    key = "sekrit"
    with (
        running_server(engine, embedder, api_key=key) as server,
        httpx.Client(base_url=server.base_url) as http,
    ):
        for method, path, kind in [*API_ROUTES, ("GET", "/docs", None)]:
            refused = send(http, method, path, kind, model_name)
            assert refused.status_code == 401, path
            assert send(http, method, path, kind, model_name, **{"x-api-key": key}).status_code == 200, path
        assert http.get("/health").status_code == 200
        bearer = {"authorization": f"Bearer {key}"}
        # an empty x-api-key beside a correct Bearer token is no key at all, not a wrong one
        assert send(http, "POST", CHAT, "chat", model_name, **bearer, **{"x-api-key": ""}).status_code == 200
        wrong = send(http, "POST", MESSAGES, "message", model_name, **{"x-api-key": "nope"})
        assert wrong.status_code == 401 and "Incorrect" in error_of(wrong, MESSAGES)[0]


# ---- work that would outlive its client -----------------------------------------------------------

FAN_OUT = {"prompt": ["batch-together 1", "batch-together 2", "batch-together 3"], "n": 4, "max_tokens": 8}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_hanging_up_while_prompts_times_n_start_aborts_them_all(server, engine, model_name, scripted, stream):
    """3 prompts x n=4 start together (not one after another), and a client gone before any first
    token aborts all 12: the fake holds every first token until 13 generations run, which never happens."""
    count = len(engine.requests)
    engine.batch_barrier = 13
    try:
        with (
            httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(30, read=0.5)) as client,
            contextlib.suppress(httpx.ReadTimeout),  # the client gives up and closes the connection
        ):
            client.post(COMPLETIONS, json=completion(model_name, **FAN_OUT, stream=stream))
        assert wait_until(lambda: len(engine.requests) >= count + 12)
        started = {request.request_id for request in engine.requests[count : count + 12]}
        assert wait_until(lambda: started <= engine.aborted and started <= engine.closed_early)
    finally:
        engine.batch_barrier = 16


def test_the_defaults_listen_on_loopback_with_cors_closed():
    import argparse

    from app.commands import serve
    from app.engine.server.settings import ServerSettings

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([])
    assert args.host == "127.0.0.1" and ServerSettings(host=args.host).is_loopback
    assert args.cors_origin == [] and ServerSettings().cors_origins == ()
    with pytest.raises(ValueError, match="max_prompts"):
        ServerSettings(max_prompts=0)
