"""Property-based run over /openapi.json: no 5xx, and every response matches the documented schema.

Bounded to a few examples per operation so the run stays around a minute on two cores.
(schemathesis' lazy pytest loader does not work with this pytest, so operations are
driven through hypothesis directly.)
"""

from __future__ import annotations

from functools import partial

import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = 25  # per operation and mode (valid data, then invalid data)


def with_served_model(case: schemathesis.Case, models: dict[str, str]) -> schemathesis.Case:
    """Valid bodies name a loaded model, so they reach the engine instead of stopping at 404."""
    if case.meta.generation.mode.is_positive and isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = models.get(case.operation.path, models["chat"])
    return case


def test_api_conforms_to_its_schema(server, model_name, embedder):
    models = {"chat": model_name, "/v1/embeddings": embedder.model_name}
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    # invalid data needs something to break: a body (GET endpoints here take none)
    runs = [(op, mode) for op in operations for mode in GenerationMode if mode.is_positive or op.method.upper() == "POST"]
    for operation, mode in runs:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode).map(partial(with_served_model, models=models)))
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, timeout=30)

        check()
