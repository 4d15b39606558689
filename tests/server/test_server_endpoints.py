"""Models, health, metrics, tokenize/detokenize and the OpenAPI document."""

from __future__ import annotations

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families


def test_models_lists_chat_and_embedding_models(openai_client, model_name, embedder, engine):
    models = {m.id: m for m in openai_client.models.list()}
    assert {model_name, embedder.model_name} <= set(models)
    assert models[model_name].model_extra["max_model_len"] == engine.model.context_length
    # The weights' formats, tensor counts per format: the loaded checkpoint's own (a mix per tensor).
    assert models[model_name].model_extra["quantization"] == engine.model.quantization
    mix = models[model_name].model_extra["quant_mix"]
    assert mix == dict(engine.model.quant_mix) and len(mix) >= 2 and all(n > 0 for n in mix.values())
    assert openai_client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-model")


def test_health(http, model_name):
    response = http.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok", "model": model_name}


def test_tokenize_and_detokenize_round_trip(http, engine):
    tokenized = http.post("/tokenize", json={"prompt": "hi <end_of_turn>", "return_token_strs": True}).json()
    assert tokenized["tokens"] == engine.tokenizer.encode("hi <end_of_turn>")
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["token_strs"] == [engine.tokenizer.id_to_token(i) for i in tokenized["tokens"]]
    no_bos = http.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False}).json()
    assert no_bos["tokens"] == engine.tokenizer.encode("hi", add_special_tokens=False)
    detokenized = http.post("/detokenize", json={"tokens": tokenized["tokens"]}).json()
    assert detokenized == {"prompt": engine.tokenizer.decode(tokenized["tokens"])}


def test_tokenize_rejects_both_or_neither_input(http):
    for body in ({}, {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}):
        response = http.post("/tokenize", json=body)
        assert response.status_code == 400 and "exactly one" in response.json()["error"]["message"]
    bad = http.post("/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and "-1" in bad.json()["error"]["message"]


def test_metrics_count_requests_tokens_and_engine_state(http, openai_client, model_name):
    reply = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "metrics"}], max_tokens=8
    )
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert (
        samples[("paddock_http_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))]
        >= 1
    )
    assert (
        samples[("paddock_generation_tokens_total", (("endpoint", "chat"),))] >= reply.usage.completion_tokens
    )
    assert samples[("paddock_time_to_first_token_seconds_count", (("endpoint", "chat"),))] >= 1
    for name in (
        "requests_waiting",
        "kv_cache_usage_ratio",
        "batch_size",
        "batch_size_max",
        "requests_running",
    ):
        assert (f"paddock_engine_{name}", ()) in samples


def test_openapi_documents_every_endpoint_without_422(http):
    schema = http.get("/openapi.json").json()
    expected = {
        "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
        "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/health", "/metrics",
    }  # fmt: skip
    assert expected <= set(schema["paths"])
    responses = [op["responses"] for path in schema["paths"].values() for op in path.values()]
    assert all("422" not in r for r in responses)
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "429"} <= set(chat)
    assert "text/event-stream" in chat["200"]["content"]
