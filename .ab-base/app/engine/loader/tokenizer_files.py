"""A Hugging Face folder's tokenizer files checked at the door, as weights are: every problem is one
line naming the file (and the key), never a traceback from the `tokenizers` library or a type error
deep in the engine.

`tokenizers` reports a malformed tokenizer.json as a bare `Exception` carrying serde's words
("invalid type: integer 5, expected a map at line 1 column 38"); a token id past the vocabulary, or a
"wrong type" in tokenizer_config.json / generation_config.json, would otherwise surface only when a
request first encodes or samples it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

# The largest real tokenizer.json files are tens of MB (Gemma 3's: 33 MB for 262,144 tokens): past this
# the file is refused before the library builds a vocabulary of it in memory.
MAX_TOKENIZER_JSON_BYTES = 256 * 1024 * 1024


def open_backend(file: Path) -> Backend:
    """The `tokenizers` backend of a tokenizer.json, with its token ids dense (0 .. size-1)."""
    size = file.stat().st_size
    if size > MAX_TOKENIZER_JSON_BYTES:
        raise ValueError(
            f"{file} is {size:,} bytes; a tokenizer.json of more than {MAX_TOKENIZER_JSON_BYTES:,} bytes "
            "is not a real vocabulary"
        )
    try:
        backend = Backend.from_file(str(file))
    except Exception as exc:  # the library raises a bare Exception for every parse and shape error
        raise ValueError(f"{file} is not a valid tokenizer.json: {_one_line(exc)}") from None
    size = backend.get_vocab_size(with_added_tokens=True)
    ids = backend.get_vocab(with_added_tokens=True)
    token, top = max(ids.items(), key=lambda item: item[1], default=("", -1))
    if top >= size:
        raise ValueError(
            f"{file}: the token {token!r} has id {top}, past the vocabulary of {size} tokens "
            "(ids must run 0 .. size-1)"
        )
    return backend


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when the folder has none."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {_one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def special_token(config: dict[str, Any], name: str, where: Path) -> str | None:
    """tokenizer_config.json's `bos_token` etc.: a string, {"content": string} or null."""
    token = config.get(name)
    if isinstance(token, dict):
        token = token.get("content")
    if token is not None and not isinstance(token, str):
        raise ValueError(f"{where} {name} is {token!r}; expected a token string")
    return token


def flag(config: dict[str, Any], name: str, where: Path) -> bool | None:
    """tokenizer_config.json's `add_bos_token` / `add_eos_token`: true, false or absent."""
    value = config.get(name)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{where} {name} is {value!r}; expected true or false")
    return value


def token_id(value: Any, where: str, vocab_size: int) -> int | None:
    """An id from a config file: an integer inside the vocabulary (or None), else a ValueError naming
    `where` (the file and the key)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} is {value!r}; a token id is an integer")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{where} is {value}, outside the vocabulary (size {vocab_size})")
    return value


def token_ids(value: Any, where: str, vocab_size: int) -> list[int]:
    """One id or a list of them (generation_config.json's eos_token_id takes both)."""
    items = value if isinstance(value, list) else [value]
    return [checked for item in items if (checked := token_id(item, where, vocab_size)) is not None]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
