"""Corrupt, truncated and lying model files are refused at open with one line that names the problem
and the key or tensor, before any large allocation: `paddock generate --model bad.gguf` prints that
line and exits 2, never a traceback. GGUF files are forged from the small random-weight fixtures'
headers and from the embedded model's (tests/engine/gguf_forge.py); safetensors folders are edited
copies of the fixtures' Hugging Face folders."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.quants import dequantize as gguf_dequantize

from app.cli import main
from app.engine.loader.gguf import read_gguf
from app.engine.quant.types import quant_type
from tests.engine.gguf_forge import Forge, Typed

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
QWEN3 = FAMILIES / "qwen3" / "qwen3-kquants.gguf"  # every block format the engine reads
LLAMA = FAMILIES / "llama" / "llama-bf16-q8_0.gguf"  # BF16 and F16 tensors


def refusal(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `paddock generate --model path` prints on stderr; it must refuse with exit code 2 and one line."""
    code = main(["generate", "--model", str(path), "--device", "cpu", "--max-tokens", "1", "hi"])
    err = capsys.readouterr().err.strip()
    assert code == 2, f"not refused: {err}"
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("paddock generate: ")
    return err


@pytest.fixture(scope="module")
def qwen3() -> Forge:
    return Forge.of(QWEN3)


@pytest.fixture(scope="module")
def embedded(embedded_gguf_path: Path) -> Forge:
    """The embedded Gemma's real header (262,144-token vocabulary) over sparse zero data."""
    return Forge.of(embedded_gguf_path, keep_data=False)


def _set(key: str, value: object) -> Callable[[Forge], None]:
    def edit(forge: Forge) -> None:
        forge.metadata[f"{forge.metadata['general.architecture']}.{key}"] = value

    return edit


def _drop(key: str) -> Callable[[Forge], None]:
    return lambda forge: forge.metadata.pop(f"{forge.metadata['general.architecture']}.{key}")


def _count(count: Callable[[int], int]) -> Callable[[Forge], None]:
    def edit(forge: Forge) -> None:
        forge.tensor_count = count(len(forge.tensors))

    return edit


def _dims(name: str, dims: list[int]) -> Callable[[Forge], None]:
    def edit(forge: Forge) -> None:
        forge.tensor(name).dims = dims

    return edit


HEADER_CASES = {
    "block_count 0": (_set("block_count", 0), "block_count is 0"),
    "block_count 1e6": (_set("block_count", 1_000_000), "block_count is 1000000"),
    "block_count above the blocks present": (_set("block_count", 5), "the file has tensors for 3 blocks"),
    "head_count 0": (_set("attention.head_count", 0), "attention.head_count is 0"),
    "head_count_kv not dividing": (
        _set("attention.head_count_kv", 3),
        "head_count = 4 is not a multiple of qwen3.attention.head_count_kv = 3",
    ),
    "context length 2**40": (
        _set("context_length", Typed(GGUFValueType.UINT64, 2**40)),
        "context_length is 1099511627776",
    ),
    "embedding_length wrong": (_set("embedding_length", 96), "embedding_length is 96"),
    "feed_forward_length wrong": (_set("feed_forward_length", 200), "feed_forward_length = 200"),
    "key_length wrong": (_set("attention.key_length", 16), "'blk.0.attn_q.weight' has shape"),
    "embedding_length missing": (_drop("embedding_length"), "metadata has no qwen3.embedding_length"),
    "rope base NaN": (_set("rope.freq_base", float("nan")), "rope.freq_base is nan"),
    "block_count a string": (_set("block_count", "three"), "block_count is 'three'"),
    "tensor count byte flipped low": (_count(lambda n: n ^ 0x04), "fewer tensors than the file holds"),
    "tensor count byte flipped high": (_count(lambda n: n | 1 << 56), "header claims"),
    "tensor count byte flipped into the data": (_count(lambda n: n ^ 0x40), "corrupt header"),
    "dims that wrap to zero rows": (
        _dims("blk.0.attn_q.weight", [64, 2**32, 2**32]),
        "'blk.0.attn_q.weight' (Q4_0, shape (4294967296, 4294967296, 64)) needs",
    ),
    "a dimension of zero": (_dims("blk.0.attn_k.weight", [64, 0]), "has an empty dimension"),
    "a tensor offset out of sequence": (
        lambda forge: setattr(forge.tensor("output.weight"), "offset", 10**9),
        "tensor 'output.weight' starts at data offset 1000000000",
    ),
    "nested arrays": (
        lambda forge: forge.metadata.__setitem__("test.nested", [[[[[[[[[[1]]]]]]]]]]),
        "arrays nested more than 8 deep",
    ),
}


@pytest.mark.parametrize("case", HEADER_CASES, ids=list(HEADER_CASES))
def test_lying_gguf_headers_are_refused_in_one_line(case, qwen3, tmp_path, capsys):
    edit, message = HEADER_CASES[case]
    forge = qwen3.copy()
    edit(forge)
    err = refusal(forge.write(tmp_path / "bad.gguf"), capsys)
    assert message in err
    assert str(tmp_path / "bad.gguf") in err


@pytest.mark.parametrize(
    "case",
    ["context length 2**40", "embedding_length wrong", "block_count 1e6", "tensor count byte flipped high"],
)
def test_lying_headers_of_the_embedded_model_are_refused(case, embedded, tmp_path, capsys):
    edit, message = HEADER_CASES[case]
    forge = embedded.copy()
    edit(forge)
    err = refusal(forge.write(tmp_path / "bad.gguf"), capsys)
    assert message.replace("qwen3", "gemma3") in err


def test_a_truncated_file_is_refused(tmp_path, capsys):
    data = QWEN3.read_bytes()
    for size in (10, 100, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:size])
        err = refusal(tmp_path / "cut.gguf", capsys)
        assert "truncated" in err


def _nan_scale(qtype_name: str) -> bytes:
    """A non-finite value in the field that scales a block of `qtype_name` (offsets from ggml's layouts)."""
    return {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f"}.get(
        qtype_name, b"\x00\x7c"
    )  # f16 inf


def _scale_offset(qtype_name: str, type_size: int) -> int:
    return type_size - 2 if qtype_name == "Q6_K" else 0  # Q6_K keeps its d last, every other format first


def _poisoned_tensors() -> list[tuple[Path, str]]:
    """One tensor of each format in the fixtures: (file, tensor name)."""
    cases: dict[str, tuple[Path, str]] = {}
    for path in (QWEN3, LLAMA):
        for name, tensor in read_gguf(path).tensors.items():
            cases.setdefault(tensor.qtype.name, (path, name))
    return sorted(cases.values(), key=lambda c: c[1])


@pytest.mark.parametrize(("path", "name"), _poisoned_tensors(), ids=lambda v: getattr(v, "name", v))
def test_a_non_finite_block_scale_or_value_is_refused_naming_the_tensor(path, name, tmp_path, capsys):
    forge = Forge.of(path)
    tensor = forge.tensor(name)
    qtype = quant_type(tensor.type_id)
    data = bytearray(tensor.data)
    block = len(data) // qtype.type_size - 1  # the last block: the whole tensor is checked
    at = block * qtype.type_size + _scale_offset(qtype.name, qtype.type_size)
    poison = _nan_scale(qtype.name)
    data[at : at + len(poison)] = poison
    tensor.data = bytes(data)
    bad = forge.write(tmp_path / "nan.gguf")
    # independent proof that the poison hit a scale: gguf-py's dequantizer now gives non-finite weights
    if qtype.name != "BF16":
        raw = np.frombuffer(tensor.data, np.uint8).reshape(-1, qtype.type_size)
        with np.errstate(invalid="ignore"):
            assert not np.isfinite(gguf_dequantize(raw, tensor.type_id)).all()
    err = refusal(bad, capsys)
    assert f"tensor {name!r} ({qtype.name}) has a NaN or infinite" in err


def test_a_generate_refusal_is_one_line_without_traceback_in_a_real_process(qwen3, tmp_path):
    forge = qwen3.copy()
    _set("attention.head_count", 0)(forge)
    bad = forge.write(tmp_path / "bad.gguf")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "generate", "--model", str(bad), "--device", "cpu", "hi"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "qwen3.attention.head_count is 0" in done.stderr


# ---------------------------------------------------------------- safetensors


def _hf_copy(tmp_path: Path, family: str = "qwen3") -> Path:
    folder = tmp_path / "hf"
    shutil.copytree(FAMILIES / family / "hf", folder)
    return folder


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _edit_header(folder: Path, edit: Callable[[dict], None]) -> None:
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    encoded = json.dumps(header).encode()  # data offsets count from the header's end: they stay valid
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


def _first_weight(header: dict) -> dict:
    return header[next(k for k in header if k.endswith("q_proj.weight"))]


CONFIG_CASES = {
    "num_hidden_layers 0": ({"num_hidden_layers": 0}, "config.json num_hidden_layers is 0"),
    "num_hidden_layers 1e6": ({"num_hidden_layers": 1_000_000}, "num_hidden_layers is 1000000"),
    "num_attention_heads 0": ({"num_attention_heads": 0}, "num_attention_heads is 0"),
    "max_position_embeddings 2**40": ({"max_position_embeddings": 2**40}, "max_position_embeddings is 1099"),
    "hidden_size wrong": ({"hidden_size": 96}, "config.json hidden_size is 96"),
    "hidden_size missing": ({"hidden_size": None}, "config.json has no hidden_size"),
    "vocab_size wrong": ({"vocab_size": 300}, "config.json vocab_size is 300"),
    "intermediate_size a string": ({"intermediate_size": "big"}, "intermediate_size is 'big'"),
}


@pytest.mark.parametrize("case", CONFIG_CASES, ids=list(CONFIG_CASES))
def test_lying_config_json_is_refused_in_one_line(case, tmp_path, capsys):
    changes, message = CONFIG_CASES[case]
    folder = _hf_copy(tmp_path)
    _edit_config(folder, **changes)
    assert message in refusal(folder, capsys)


HEADER_EDITS = {
    "a huge shape": (lambda h: _first_weight(h).update(shape=[2**40, 2**40]), "do not hold"),
    "a shape past int64": (lambda h: _first_weight(h).update(shape=[2**70, 2]), "do not hold"),
    "a negative dimension": (lambda h: _first_weight(h).update(shape=[-4, -32]), "malformed header entry"),
    "a float dimension": (lambda h: _first_weight(h).update(shape=[64.5, 2]), "malformed header entry"),
    "a list as dtype": (lambda h: _first_weight(h).update(dtype=["F32"]), "malformed header entry"),
    "offsets past the end": (lambda h: _first_weight(h).update(data_offsets=[0, 10**12]), "do not hold"),
    "a wrong but consistent shape": (
        lambda h: _first_weight(h).update(shape=list(reversed(_first_weight(h)["shape"]))),
        "has shape",
    ),
}


@pytest.mark.parametrize("case", HEADER_EDITS, ids=list(HEADER_EDITS))
def test_lying_safetensors_headers_are_refused_in_one_line(case, tmp_path, capsys):
    edit, message = HEADER_EDITS[case]
    folder = _hf_copy(tmp_path)
    _edit_header(folder, edit)
    assert message in refusal(folder, capsys)


def test_a_safetensors_header_nested_too_deep_is_refused(tmp_path, capsys):
    folder = _hf_copy(tmp_path)
    nested = b"[" * 100_000 + b"]" * 100_000
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(nested)) + nested)
    assert "nested too deep" in refusal(folder, capsys)


def test_a_truncated_safetensors_file_is_refused(tmp_path, capsys):
    folder = _hf_copy(tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    assert "truncated or corrupt" in refusal(folder, capsys)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_nan_weight_in_safetensors_is_refused_naming_the_tensor(family, tmp_path, capsys):
    folder = _hf_copy(tmp_path, family)
    path = folder / "model.safetensors"
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + length])
    name = next(k for k in header if k.endswith("layers.0.mlp.down_proj.weight"))
    entry = header[name]
    nan = {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}[entry["dtype"]]
    at = 8 + length + entry["data_offsets"][1] - len(nan)  # the tensor's last value
    raw[at : at + len(nan)] = nan
    path.write_bytes(bytes(raw))
    err = refusal(folder, capsys)
    assert "blk.0.ffn_down.weight" in err and "NaN or infinite value" in err


# ---------------------------------------------------------------- tokenizer files

VISION_GEMMA = (
    Path(__file__).resolve().parents[1] / "fixtures" / "vision" / "gemma3" / "hf"
)  # has tokenizer files


def _edit_json(name: str, edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    """Rewrite one JSON file of the folder: `edit` changes the parsed value in place, or returns the
    new text (for files that are not JSON at all)."""

    def apply(folder: Path) -> None:
        path = folder / name
        data = json.loads(path.read_text())
        text = edit(data)
        path.write_text(text if isinstance(text, str) else json.dumps(data))

    return apply


def _model(**changes: Any) -> Callable[[Any], None]:
    return lambda tokenizer: tokenizer["model"].update(changes)


def _vocab(token: str, value: Any) -> Callable[[Any], None]:
    return lambda tokenizer: tokenizer["model"]["vocab"].update({token: value})


TOKENIZER = "tokenizer.json"
CONFIG = "tokenizer_config.json"
GENERATION = "generation_config.json"
# (file, edit, words of the one-line refusal); issue 40 found 4 of 4 variants printing a traceback
TOKENIZER_CASES = {
    "truncated": (TOKENIZER, lambda t: json.dumps(t)[:2000], "EOF while parsing"),
    "empty": (TOKENIZER, lambda t: "", "EOF while parsing"),
    "a list, not an object": (TOKENIZER, lambda t: "[]", "expected struct Tokenizer"),
    "model an integer": (TOKENIZER, lambda t: t.update(model=5), "ModelUntagged"),
    "vocab a list of integers": (TOKENIZER, _model(vocab=[1, 2, 3]), "expected a map"),
    "a vocab id a string": (TOKENIZER, _vocab("x", "seven"), 'string "seven", expected u32'),
    "a negative vocab id": (TOKENIZER, _vocab("x", -3), "integer `-3`, expected u32"),
    "a vocab id past u32": (TOKENIZER, _vocab("x", 2**40), "expected u32"),
    "a vocab id past the vocabulary": (TOKENIZER, _vocab("xx", 4_000_000_000), "has id 4000000000, past the"),
    "a merge out of the vocabulary": (TOKENIZER, _model(merges=["a zzzzq"]), "`zzzzq` out of vocabulary"),
    "a merge without its space": (TOKENIZER, _model(merges=["abc"]), "Merges text file invalid"),
    "merges an integer": (TOKENIZER, _model(merges=5), "MergeType"),
    "an unknown model type": (TOKENIZER, _model(type="Nope"), "ModelUntagged"),
    "added tokens a string": (TOKENIZER, lambda t: t.update(added_tokens="x"), "expected a sequence"),
    "config truncated": (CONFIG, lambda c: '{"bos_token": "<b', "cannot read"),
    "config a list": (CONFIG, lambda c: "[1, 2]", "holds a JSON list, not an object"),
    "config bos_token an integer": (CONFIG, lambda c: c.update(bos_token=5), "bos_token is 5"),
    "config add_bos_token a string": (
        CONFIG,
        lambda c: c.update(add_bos_token="no"),
        "add_bos_token is 'no'",
    ),
    "config eos_token unknown": (CONFIG, lambda c: c.update(eos_token="<nope>"), "'<nope>' is not in"),
    "config chat_template an integer": (CONFIG, lambda c: c.update(chat_template=5), "chat_template is 5"),
    "generation eos a string": (GENERATION, lambda g: g.update(eos_token_id="one"), "eos_token_id is 'one'"),
    "generation eos past the vocabulary": (
        GENERATION,
        lambda g: g.update(eos_token_id=[2**40]),
        "outside the",
    ),
}


@pytest.mark.parametrize("case", TOKENIZER_CASES, ids=list(TOKENIZER_CASES))
def test_corrupt_tokenizer_files_are_refused_in_one_line_naming_the_file(case, tmp_path, capsys):
    name, edit, words = TOKENIZER_CASES[case]
    folder = tmp_path / "hf"
    shutil.copytree(VISION_GEMMA, folder)
    _edit_json(name, edit)(folder)
    message = refusal(folder, capsys)
    assert str(folder / name) in message and words in message, message


def test_a_tokenizer_json_past_the_size_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    from app.engine.loader import tokenizer_files
    from app.engine.loader.tokenizer import Tokenizer

    folder = tmp_path / "hf"
    shutil.copytree(VISION_GEMMA, folder)
    monkeypatch.setattr(tokenizer_files, "MAX_TOKENIZER_JSON_BYTES", 1024)
    with pytest.raises(
        ValueError, match=r"tokenizer\.json is \d[\d,]* bytes; a tokenizer\.json of more than 1,024"
    ):
        Tokenizer.from_pretrained_dir(folder)


def test_a_corrupt_tokenizer_is_one_line_from_a_real_process(tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(VISION_GEMMA, folder)
    (folder / TOKENIZER).write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": 5}}')
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "generate", "--model", str(folder), "--device", "cpu", "hi"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert f"{folder / TOKENIZER} is not a valid tokenizer.json" in done.stderr
