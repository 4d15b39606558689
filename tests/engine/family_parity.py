"""What the per-family parity tests (test_gemma4.py, test_laguna.py) share: a fixture folder made by a
tests/fixtures/make_*_reference.py script (Hugging Face folders per case, transformers' float32 logits and
greedy tokens in references.npz, manifest.json), GGUFs written from those folders at test time, the models
built on a CPU kernel set, the logit check against transformers, and the whole engine on a fixture; and the
comparisons the vision and speech tests make with transformers' outputs (`close_to_scale`, `check_top_logprobs`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as GQ
from model_harness import run_logits

from app.cli import main
from app.engine import EngineConfig, LLMEngine, SamplingParams
from app.engine.backend import cpu_backend
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model, model_config
from app.engine.plan.fit import FitOptions, check_fit, cpu_memory, shape_from_checkpoint
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES
from tests.engine.gguf_forge import Forge

MAX_POSITIONS = 64
F32 = QUANT_TYPES["F32"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


class ParityFixtures:
    def __init__(self, folder: Path, write_gguf: Callable[..., None]) -> None:
        self.folder, self._write_gguf = folder, write_gguf
        self.manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        self.tokens: list[int] = self.manifest["tokens"]
        self.prompt_len: int = self.manifest["prompt_len"]
        self.cases = sorted(self.manifest["cases"])
        self._gguf: dict[tuple[str, str], Path] = {}

    @functools.cache  # noqa: B019 (one instance per test module, alive for the session)
    def reference(self, case: str, what: str) -> np.ndarray:
        with np.load(self.folder / "references.npz") as refs:
            return refs[f"{case}.{what}"]

    def path(self, case: str, fmt: str, tmp_root: str) -> Path:
        """The case's HF folder, or a GGUF written from it under `tmp_root` (once per session)."""
        if fmt == "hf":
            return self.folder / case
        if (case, tmp_root) not in self._gguf:
            out = Path(tmp_root) / f"{self.folder.name}-{case}.gguf"
            self._write_gguf(self.folder / case, out)
            self._gguf[case, tmp_root] = out
        return self._gguf[case, tmp_root]

    def check_logits(self, case: str, path: Path, label: str, mode: str, kernels: str, rtol: float) -> None:
        """The model's logits over the fixture's tokens within `rtol` of the case's logit scale of
        transformers', the same greedy token at every position, the first generated token's top-5
        log-probs within 1e-3."""
        built, backend = model(path, kernels)
        ours = run_logits(built, backend, self.tokens, mode)
        expected = self.reference(case, "logits")
        tol = rtol * max(1.0, float(np.abs(expected).max()))
        worst = float(np.abs(ours - expected).max())
        assert worst <= tol, f"{case} ({label}): max |ours - transformers| = {worst:.3g} > {tol:.3g}"
        assert (ours.argmax(-1) == expected.argmax(-1)).all(), f"{case} ({label}): a greedy token differs"
        first = self.prompt_len - 1  # the first generated token's distribution
        top5 = np.argsort(-expected[first])[:5]
        diff = np.abs(log_softmax(ours[first])[top5] - log_softmax(expected[first])[top5]).max()
        assert diff <= 1e-3, f"{case} ({label}): top-5 log-probs differ by {diff:.3g}"


@functools.cache
def model(path: Path, kernels: str):
    checkpoint = open_checkpoint(path)
    backend = cpu_backend(kernels)
    return build_model(checkpoint, backend, MAX_POSITIONS, model_config(checkpoint)), backend


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def close_to_scale(actual: Any, expected: np.ndarray, rel: float = 1e-4) -> None:
    """`actual` within `rel` of the largest |expected| everywhere (activations' scale, not each value's)."""
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rel * float(np.abs(expected).max()))


def check_top_logprobs(top: list[tuple[int, float]], logits: np.ndarray, k: int, atol: float) -> None:
    """The engine's top-`k` log-probs of a step (`result["logprobs"][i].top`) are those of transformers' logits
    row for it: the same tokens in the same order, each log-prob within `atol`."""
    expected = log_softmax(np.asarray(logits))
    assert [t for t, _ in top] == list(np.argsort(-expected)[:k])
    np.testing.assert_allclose([lp for _, lp in top], np.sort(expected)[::-1][:k], atol=atol)


def engine_for(path: Path, kernels: str = "numpy") -> LLMEngine:
    """The whole CPU engine on a fixture, prefill in chunks of 16 tokens (a 40-token prompt takes three)."""
    return LLMEngine(
        EngineConfig(
            model=str(path),
            device="cpu",
            cpu_kernels=kernels,
            max_num_seqs=8,
            max_num_batched_tokens=16,
            max_model_len=MAX_POSITIONS,
        )
    )


def refusal(path: Path, capsys: Any) -> str:
    """What `paddock generate --model path` prints: exit code 2, one line, no traceback."""
    code = main(["generate", "--model", str(path), "--device", "cpu", "--max-tokens", "1", "hi"])
    err = capsys.readouterr().err.strip()
    assert code == 2, f"not refused: {err}"
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def edited_copy(folder: Path, tmp_path: Path, section: str | None = None, **changes: object) -> Path:
    """A copy of an HF fixture folder under `tmp_path` whose config.json (its `section`, e.g. text_config)
    has `changes` applied."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    path = copy / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    (cfg[section] if section else cfg).update(changes)
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return copy


def forged_refusal(gguf: Path, edit: Callable[[Forge], Any], tmp_path: Path, capsys: Any) -> tuple[Path, str]:
    """A copy of `gguf` with its header edited (tests/engine/gguf_forge.py), and the engine's refusal of it."""
    forge = Forge.of(gguf)
    edit(forge)
    path = forge.write(tmp_path / "bad.gguf")
    return path, refusal(path, capsys)


def truncated_ggufs_are_refused(gguf: Path, tmp_path: Path, capsys: Any) -> None:
    """`gguf` cut in its header, midway and one byte short: refused as truncated, naming the file."""
    data = gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in (100, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:size])
        err = refusal(cut, capsys)
        assert "truncated" in err and str(cut) in err


def fit_predicts_the_engines_blocks(path: Path) -> None:
    """`paddock fit`'s shape of `path` gives the KV blocks and context the engine allocates, at two settings."""
    shape = shape_from_checkpoint(path)
    for settings in (dict(max_model_len=64, max_num_seqs=2), dict(max_model_len=200, kv_cache_bytes=1 << 19)):
        engine = LLMEngine(EngineConfig(model=str(path), device="cpu", cpu_kernels="numpy", **settings))
        report = check_fit(shape, FitOptions.from_engine(engine.config), cpu_memory())
        assert (report.kv_blocks, report.engine_context) == (engine.plan.num_blocks, engine.max_model_len)


def q8_0_gguf_equals_its_floats(parity: ParityFixtures, case: str, tmp_path: Path, agreement: float) -> None:
    """The case written as a Q8_0 GGUF (`parity`'s writer with a qtype): its attention gate and q in Q8_0,
    its logits equal, within float32 rounding, those of the same file with every tensor dequantized to
    float32 (the quantized products read the blocks as the floats say), and transformers' greedy token at
    `agreement` of the positions or more (a sanity check of the blocks' values: a random tiny model
    amplifies Q8_0's rounding)."""
    path = tmp_path / "q8_0.gguf"
    parity._write_gguf(parity.folder / case, path, GQ.Q8_0)
    types = {name: t.qtype.name for name, t in open_checkpoint(path).tensors.items()}
    assert types["blk.1.attn_gate.weight"] == types["blk.1.attn_q.weight"] == "Q8_0"
    ours = _quantized_equals_its_floats(path, parity.tokens)
    assert (ours.argmax(-1) == parity.reference(case, "logits").argmax(-1)).mean() >= agreement


def _quantized_equals_its_floats(path: Path, tokens: list[int]) -> np.ndarray:
    checkpoint = open_checkpoint(path)
    floats = {n: QuantizedTensor.from_float(n, t.dequantize(), F32) for n, t in checkpoint.tensors.items()}
    backend = cpu_backend("numpy")
    ours = run_logits(build_model(checkpoint, backend, MAX_POSITIONS), backend, tokens, "prefill")
    as_floats = build_model(dataclasses.replace(checkpoint, tensors=floats), backend, MAX_POSITIONS)
    expected = run_logits(as_floats, backend, tokens, "prefill")
    assert np.abs(ours - expected).max() <= 1e-5 * max(1.0, float(np.abs(expected).max()))
    return ours


def numba_engine_equals_numpy(path: Path, prompt: list[int]) -> None:
    """The whole engine on the numba kernels generates numpy's greedy tokens, and its first generated
    token's top-5 log-probs are within 1e-3 of numpy's (the bound check_logits holds both to against
    transformers)."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=5)
    [fast] = engine_for(path, kernels="numba").generate([prompt], params)
    [reference] = engine_for(path).generate([prompt], params)
    assert fast["token_ids"] == reference["token_ids"]
    ours = dict(fast["logprobs"][0].top)
    for token, value in reference["logprobs"][0].top:
        assert abs(ours.get(token, -99.0) - value) <= 1e-3, f"token {token}: {ours.get(token)} vs {value}"


def batch_of_eight_equals_alone(engine: LLMEngine) -> None:
    """Eight prompts of different lengths generated together decode as each does alone."""
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 256, n)] for n in (5, 9, 17, 23, 31, 12, 40, 3)]
    together = [r["token_ids"] for r in engine.generate(prompts, GREEDY)]
    alone = [engine.generate([p], GREEDY)[0]["token_ids"] for p in prompts]
    assert together == alone
