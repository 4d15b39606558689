"""Every error case answers with the right status and in the calling protocol's own shape."""

from __future__ import annotations

import threading

import anthropic
import httpx
import openai
import pytest

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT, sse_events, wait_until

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


def test_malformed_json_is_400_in_each_shape(http):
    headers = {"content-type": "application/json"}
    error = assert_openai_error(http.post(CHAT, content=b'{"model": ', headers=headers), 400)
    assert "Malformed JSON" in error["message"]
    assert_anthropic_error(
        http.post(MESSAGES, content=b"{oops", headers=headers), 400, "invalid_request_error"
    )


def test_wrong_types_are_400_naming_the_field(http, model_name):
    error = assert_openai_error(http.post(CHAT, json={"model": model_name, "messages": "hello"}), 400)
    assert error["param"] == "messages"
    error = assert_openai_error(
        http.post(CHAT, json={"model": model_name, "messages": [{"role": "robot"}]}), 400
    )
    assert error["param"] == "messages[0].role"
    body = {"model": model_name, "max_tokens": "lots", "messages": [{"role": "user", "content": "x"}]}
    assert (
        "max_tokens"
        in assert_anthropic_error(http.post(MESSAGES, json=body), 400, "invalid_request_error")["message"]
    )
    assert_openai_error(http.post(CHAT, json=[1, 2]), 400)


def test_out_of_range_sampling_values_are_400(http, model_name):
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        "min_tokens": 5,
    }
    error = assert_openai_error(http.post(CHAT, json=body), 400)
    assert "min_tokens" in error["message"]


def test_unknown_model_is_404(openai_client, anthropic_client):
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found" and "gpt-9" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="gpt-9", prompt="x")
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.create(model="gpt-9", input="x")
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic_client.messages.create(
            model="claude-9", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_prompt_plus_max_tokens_over_the_context_is_400_naming_both(
    openai_client, anthropic_client, http, engine, model_name
):
    context = engine.model.context_length
    messages = [{"role": "user", "content": "hello"}]
    prompt = http.post("/tokenize", json={"messages": messages}).json()["count"]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model=model_name, messages=messages, max_tokens=context)
    message = caught.value.body["message"]
    assert (
        f"{prompt} in the prompt" in message
        and f"{context} for the completion" in message
        and str(context) in message
    )
    assert caught.value.body["code"] == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client.messages.create(model=model_name, max_tokens=context, messages=messages)
    # Anthropic's own words, which Claude Code parses to retry with a smaller max_tokens
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": f"input length and `max_tokens` exceed context limit: {prompt} + {context} > {context}, "
        "decrease input length or `max_tokens` and try again",
    }
    too_long = engine.tokenizer.encode("x", add_special_tokens=False)[:1] * (context + 10)
    with pytest.raises(openai.BadRequestError) as caught:  # a prompt alone over the context: no room at all
        openai_client.completions.create(model=model_name, prompt=too_long, max_tokens=None)
    assert f"{context + 10} in the prompt" in caught.value.body["message"]
    assert caught.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(model=model_name, input="hello", max_output_tokens=context)
    assert caught.value.body["param"] == "input"


def test_a_prompt_alone_over_the_context_gets_anthropics_prompt_too_long(
    anthropic_client, engine, model_name
):
    context = engine.model.context_length
    messages = [{"role": "user", "content": "word " * (context + 10)}]
    prompt = anthropic_client.messages.count_tokens(model=model_name, messages=messages).input_tokens
    assert prompt > context
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client.messages.create(model=model_name, max_tokens=100, messages=messages)
    assert caught.value.status_code == 400
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {prompt} tokens > {context} maximum",
    }


def test_unknown_route_and_wrong_method(http):
    assert "No such endpoint" in assert_openai_error(http.get("/v1/nothing"), 404)["message"]
    assert_openai_error(http.get(CHAT), 405)


def test_lone_surrogates_are_refused_not_crashed_on(http, model_name):
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}' % model_name.encode()
    error = assert_openai_error(
        http.post(CHAT, content=body, headers={"content-type": "application/json"}), 400
    )
    assert "surrogate" in error["message"]


def test_body_over_the_cap_is_413(engine, model_name):
    with (
        running_server(engine, max_body_bytes=2048) as server,
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as http,
    ):
        big = {"model": model_name, "messages": [{"role": "user", "content": "x" * 5000}]}
        assert_openai_error(http.post(CHAT, json=big), 413)
        assert_anthropic_error(http.post(MESSAGES, json={**big, "max_tokens": 5}), 413, "request_too_large")

        def chunked():  # no Content-Length: the cap is enforced while reading
            yield b'{"model": "x", "prompt": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        json_type = {"content-type": "application/json"}
        assert_openai_error(http.post("/v1/completions", content=chunked(), headers=json_type), 413)
        assert (
            http.post(
                CHAT,
                json={"model": model_name, "messages": [{"role": "user", "content": "ok"}], "max_tokens": 4},
            ).status_code
            == 200
        )


def test_too_many_requests_in_flight_is_429_with_retry_after(engine, model_name, scripted):
    with (
        running_server(engine, max_concurrent_requests=1) as server,
        httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as http,
    ):
        body = {
            "model": model_name,
            "stream": True,
            "max_tokens": 200,
            "messages": [{"role": "user", "content": "forever"}],
        }
        with http.stream("POST", CHAT, json=body) as held:
            lines = held.iter_lines()  # keep a reference: a dropped iterator closes the connection
            next(lines)  # the first request is generating
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}])
            assert caught.value.response.headers["retry-after"] == "1"
            rejected = http.post(
                MESSAGES, json={"model": model_name, "max_tokens": 5, "messages": body["messages"]}
            )
            assert_anthropic_error(rejected, 429, "rate_limit_error")
            assert rejected.headers["retry-after"] == "1"
        # once the held stream's connection is gone its slot frees (asynchronously, so poll)
        one = {"model": model_name, "messages": [{"role": "user", "content": "x"}]}
        assert wait_until(lambda: http.post(CHAT, json=one).status_code == 200)


def test_api_key_is_required_when_set(engine, model_name, scripted):
    with running_server(engine, api_key="sekrit") as server, httpx.Client(base_url=server.base_url) as http:
        url = f"{server.base_url}/v1"
        turn = [{"role": "user", "content": "x"}]
        with pytest.raises(openai.AuthenticationError) as caught:
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).chat.completions.create(
                model=model_name, messages=turn
            )
        assert caught.value.body["code"] == "invalid_api_key"
        assert "Missing API key" in assert_openai_error(http.get("/v1/models"), 401)["message"]
        assert openai.OpenAI(base_url=url, api_key="sekrit").chat.completions.create(
            model=model_name, messages=turn
        )
        with pytest.raises(anthropic.AuthenticationError) as caught:
            anthropic.Anthropic(base_url=server.base_url, api_key="nope", max_retries=0).messages.create(
                model=model_name, max_tokens=5, messages=turn
            )
        assert caught.value.body["error"]["type"] == "authentication_error"
        good = anthropic.Anthropic(base_url=server.base_url, api_key="sekrit")
        assert (
            good.messages.create(model=model_name, max_tokens=50, messages=turn).content[0].text == "Echo: x"
        )
        assert http.get("/health").status_code == 200  # health stays open for monitors
        assert http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401


def test_server_threads_do_not_leak(engine):
    before = threading.active_count()
    with running_server(engine):
        pass
    # worker threads of servers stopped earlier may still be exiting: the count must not grow
    assert wait_until(lambda: threading.active_count() <= before)


def test_an_engine_failure_is_an_error_not_a_crash(http, model_name, scripted):
    turn = [{"role": "user", "content": "explode"}]
    error = assert_openai_error(http.post(CHAT, json={"model": model_name, "messages": turn}), 500)
    assert "simulated engine failure" in error["message"]
    streamed = sse_events(http.post(CHAT, json={"model": model_name, "messages": turn, "stream": True}))
    assert "simulated engine failure" in streamed[-2][1]["error"]["message"] and streamed[-1][1] == "[DONE]"
    body = {"model": model_name, "max_tokens": 50, "messages": turn, "stream": True}
    name, data = sse_events(http.post(MESSAGES, json=body))[-1]
    assert name == "error" and data["error"]["type"] == "api_error"
