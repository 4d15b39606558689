"""Property-based run over /openapi.json: no 5xx, and every response matches the documented schema.

Bounded to a few examples per operation so the run stays around a minute on two cores.
(schemathesis' lazy pytest loader does not work with this pytest, so operations are
driven through hypothesis directly.)
"""

from __future__ import annotations

from functools import partial

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.engine.server.launch import ServerHandle

from .conftest import running_server
from .fakes import FakeEngine

pytestmark = pytest.mark.slow  # ~2 min: hundreds of generated requests against both engines

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# per operation and mode (valid data, then invalid data); a real engine on a CPU prefills
# the long random prompts slowly, so it gets fewer examples and more time per request
EXAMPLES = {"fake": 25, "real": 3}
REQUEST_TIMEOUT = {"fake": 30, "real": 180}
OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_OUTPUT = 8


def with_served_model(case: schemathesis.Case, models: dict[str, str]) -> schemathesis.Case:
    """Valid bodies name a loaded model, so they reach the engine instead of stopping at 404,
    and ask for few tokens, so a real engine on a CPU finishes each case quickly."""
    if case.meta.generation.mode.is_positive and isinstance(case.body, dict):
        if "model" in case.body:
            case.body["model"] = models.get(case.operation.path, models["chat"])
        for field in OUTPUT_LIMITS:
            if isinstance(case.body.get(field), int) and case.body[field] > MAX_OUTPUT:
                case.body[field] = MAX_OUTPUT
    return case


def test_api_conforms_to_its_schema(engine, model_name, embedder):
    models = {"chat": model_name, "/v1/embeddings": embedder.model_name}
    kind = "fake" if isinstance(engine, FakeEngine) else "real"
    # requests that set no output limit get MAX_OUTPUT tokens instead of the rest of the context
    with running_server(engine, embedder, default_max_tokens=MAX_OUTPUT) as server:
        run_all_operations(server, models, EXAMPLES[kind], REQUEST_TIMEOUT[kind])


def run_all_operations(server: ServerHandle, models: dict[str, str], examples: int, timeout: float) -> None:
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    # invalid data needs something to break: a body (GET endpoints here take none)
    runs = [
        (op, mode)
        for op in operations
        for mode in GenerationMode
        if mode.is_positive or op.method.upper() == "POST"
    ]
    for operation, mode in runs:

        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(
            case=operation.as_strategy(generation_mode=mode).map(partial(with_served_model, models=models))
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, timeout=timeout)

        check()
