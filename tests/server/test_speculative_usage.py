"""Speculative decoding's figures through the HTTP server on the real embedded model: the OpenAI and
Anthropic usage fields (drafted tokens accepted and rejected) and the /metrics counters agree."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.engine.core.async_engine import AsyncEngine
from app.engine.sample.sampler import may_verify
from app.engine.spec.speculator import build_speculator

from .conftest import running_server

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 3
MESSAGES = [{"role": "user", "content": CODE + "Repeat the code above exactly."}]


def test_usage_and_metrics_report_drafted_and_accepted_tokens(embedded_engine):
    embedded_engine.speculator = speculator = build_speculator("ngram", 8, 4, may_verify)
    engine = AsyncEngine(engine=embedded_engine)
    try:
        with running_server(engine) as server, httpx.Client(base_url=server.base_url, timeout=600) as http:
            chat = http.post("/v1/chat/completions", json={"model": engine.model.name, "messages": MESSAGES,
                                                           "max_tokens": 24, "temperature": 0}).json()  # fmt: skip
            details = chat["usage"]["completion_tokens_details"]
            after_chat = (speculator.drafted, speculator.accepted)
            assert after_chat[0] > 0
            assert details["accepted_prediction_tokens"] == after_chat[1]
            assert details["rejected_prediction_tokens"] == after_chat[0] - after_chat[1]
            message = http.post("/v1/messages", json={"model": engine.model.name, "messages": MESSAGES,
                                                      "max_tokens": 24, "temperature": 0}).json()  # fmt: skip
            drafted, accepted = speculator.drafted - after_chat[0], speculator.accepted - after_chat[1]
            assert message["usage"]["output_tokens_details"]["accepted_prediction_tokens"] == accepted
            assert message["usage"]["output_tokens_details"]["rejected_prediction_tokens"] == drafted - accepted
            metrics = http.get("/metrics").text
        samples = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
        assert samples["paddock_engine_spec_draft_tokens_total"] == speculator.drafted
        assert samples["paddock_engine_spec_accepted_tokens_total"] == speculator.accepted
    finally:
        engine.close()
        embedded_engine.speculator = None
