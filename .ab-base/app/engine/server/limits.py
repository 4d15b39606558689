"""What one request may carry: the caps checked at the edge, before anything reaches the engine.

Fixed caps live here and in the protocol models (the same on every server, documented in
`/openapi.json`); the ones an operator tunes per route are `ServerSettings` fields. A request
over a cap is refused with a 400 naming the field, never trimmed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.engine.server.errors import bad_request

if TYPE_CHECKING:
    from app.engine.server.settings import ServerSettings

MAX_MESSAGES = 10_000  # turns in one conversation
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 16_384  # all stop strings together
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS = 300  # entries, as OpenAI caps them
MAX_TOOLS = 256
MAX_TOOL_NODES = 20_000  # JSON values (objects, arrays, scalars) in all tool definitions together
MAX_JSON_DEPTH = 64  # nesting of any JSON value: tool schemas, tool-call arguments, template kwargs
SEED_MAX = 2**64 - 1  # seeds are unsigned 64-bit, as the samplers hold them
RANDOM_SEED = -1  # llama.cpp's and vLLM's "pick one at random"

# An embedding model reads at most its window of tokens from a text; real text spells a token in under 10
# characters (English averages 4). Past this many characters per token of the window a text is refused
# (embeddings) or cut (rerank, which scores the beginning of a long text anyway) before it is tokenized:
# tokenizing a 15 MB query only to keep its first 256 tokens took 41 s and 5 GB.
MAX_CHARS_PER_TOKEN = 64

# Per-field node caps: the fields whose size the prompt renders as text (schemas) get one.
_NODE_CAPS = {"tools": MAX_TOOL_NODES}


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            step = f".{str(key).encode('utf-8', 'backslashreplace').decode()}"  # a path that can be printed
            yield step, key
            yield step, item
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield f"[{index}]", item
    elif isinstance(value, BaseModel):
        for key, item in value:
            yield f".{key}", item


def check_json_value(
    value: Any, path: str, *, max_depth: int = MAX_JSON_DEPTH, max_nodes: int | None = None
) -> None:
    """Raise ValueError naming the place of the first string that is not valid Unicode (a lone
    surrogate, which JSON escapes allow and UTF-8 cannot encode), or of nesting deeper than `max_depth`.

    Iterative, so a value nested thousands deep cannot exhaust the stack."""
    stack = [(path, value, 0)]
    nodes = 0
    while stack:
        where, item, depth = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise ValueError(f"'{path}' is too large: more than {max_nodes} JSON values")
        if isinstance(item, str):
            ensure_encodable(item, where)
        elif depth > max_depth:
            raise ValueError(f"'{path}' is nested more than {max_depth} levels deep")
        else:
            stack.extend((where + step, child, depth + 1) for step, child in _children(item))


def ensure_encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"'{where}' contains invalid Unicode (a lone surrogate at position {exc.start})"
        ) from exc


def check_stops(stops: str | list[str] | None) -> str | list[str] | None:
    """The stop strings a client sends: at most MAX_STOP_STRINGS, MAX_STOP_CHARS in all."""
    items = [stops] if isinstance(stops, str) else stops or []
    if len(items) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, not {len(items)}")
    total = sum(len(item) for item in items)
    if total > MAX_STOP_CHARS:
        raise ValueError(f"the stop strings total {total} characters; at most {MAX_STOP_CHARS} are allowed")
    return stops


def check_seed(seed: int | None) -> int | None:
    """0 .. 2**64-1 as given; -1 means unseeded (random); anything else is refused."""
    if seed is None or seed == RANDOM_SEED:
        return None
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be between 0 and {SEED_MAX} (or -1 for a random seed), not {seed}")
    return seed


def embedding_char_cap(window_tokens: int) -> int:
    """The most characters of one text an embedding model with this window is given to tokenize."""
    return window_tokens * MAX_CHARS_PER_TOKEN


def check_fan_out(settings: ServerSettings, n: int, prompts: int = 1) -> None:
    """How many generations one request may start: n, the prompt list, and the two together."""
    caps = [
        (n, settings.max_choices, "n", "choices (n)"),
        (prompts, settings.max_prompts, "prompt", "prompts in the list"),
        (n * prompts, settings.max_generations, "n", "generations (n x prompts)"),
    ]
    for count, cap, param, what in caps:
        if count > cap:
            raise bad_request(
                f"This request asks for {count} {what}; the server allows at most {cap}.", param=param
            )


class EdgeChecked(BaseModel):
    """A request model whose every field is walked once on arrival (see `check_json_value`), and whose
    numbers are finite: JSON parsers take `Infinity` and `NaN`, and `temperature: Infinity` was sampled."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _encodable_and_shallow(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        check_json_value(value, name, max_nodes=_NODE_CAPS.get(name))
        return value


Seed = Annotated[
    int | None,
    AfterValidator(check_seed),
    Field(description=f"0 .. {SEED_MAX}; -1 or absent: a random seed"),
]
Stop = Annotated[str | list[str] | None, AfterValidator(check_stops)]
StopSequences = Annotated[list[str] | None, AfterValidator(check_stops)]
