"""Laguna against transformers 5.24, on tiny random-weight checkpoints.

tests/fixtures/laguna/ holds four Hugging Face folders made by tests/fixtures/make_laguna_reference.py
(run in .venv-ref; this test never imports torch or transformers) and transformers' float32 logits at every
position of a 40-token sequence, plus its greedy continuation of the first 32 tokens:

- `xs` (as Laguna-XS.2): a full layer, then sliding ones (window 8) with more query heads (4, then 8),
  half-dim RoPE at base 500000 on the full layer and whole-head RoPE at 10000 on the sliding ones, the
  softplus output gate per head, a dense layer then sparse ones (sigmoid routing with a correction bias,
  scaled, and a shared expert);
- `m` (as Laguna-M.1): full attention only, the gate per element, two dense layers;
- `yarn`: `xs` with YaRN on the full layers (Laguna-XS.2's RoPE; GGUF: `rope.scaling.*`);
- `softcap`: `m` with tanh-softcapped router logits (a config.json key only: no GGUF case).

Each runs from the HF folder and (but `softcap`) from a GGUF written here, at test time, in llama.cpp's
`laguna` layout (tests/engine/laguna_gguf.py), on the numpy reference and the numba CPU kernels. Both sides
compute in float32 from the same (bfloat16) weights: the difference is float32 rounding, within
tests/engine/test_families.py's bound of 1e-5 of the case's logit scale (measured: <= 1.4e-6 over every
case, format, mode and kernel set); a wrong RoPE width or scaling, gate or routing moves logits by percents. Greedy tokens equal at every position; the first
generated token's top-5 log-probs within 1e-3.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from family_parity import (
    GREEDY,
    ParityFixtures,
    batch_of_eight_equals_alone,
    engine_for,
    numba_engine_equals_numpy,
)
from laguna_gguf import write_gguf
from model_harness import MODES

from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import model_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "laguna"
PARITY = ParityFixtures(FIXTURES, write_gguf)
CASES = PARITY.cases
GGUF_CASES = [
    c for c in CASES if not PARITY.manifest["cases"][c]["config"].get("moe_router_logit_softcapping")
]
FORMATS = [(case, "hf") for case in CASES] + [(case, "gguf") for case in GGUF_CASES]
RTOL = 1e-5  # test_families.py's bound; measured <= 1.4e-6


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("laguna-gguf"))


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("case", "fmt"), FORMATS)
def test_logits_match_transformers(case: str, fmt: str, mode: str, kernels: str, gguf_dir: str) -> None:
    PARITY.check_logits(
        case, PARITY.path(case, fmt, gguf_dir), f"{fmt}, {mode}, {kernels}", mode, kernels, RTOL
    )


def test_both_formats_read_the_same_config() -> None:
    """The GGUF's keys (head-count array, leading dense count, default SWA period, rope dims, the gate's kind
    from its rows) say what config.json says."""
    fields = ("num_heads", "layer_num_heads", "layer_sliding", "layer_ffns", "rotary_dim",
              "rope_theta", "rope_theta_local", "sliding_window", "gate_proj", "moe", "rope_scaling")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for case in GGUF_CASES:
            hf = model_config(open_checkpoint(FIXTURES / case))
            gguf = model_config(open_checkpoint(PARITY.path(case, "gguf", tmp)))
            assert {f: getattr(gguf, f) for f in fields} == {f: getattr(hf, f) for f in fields}, case
    xs = model_config(open_checkpoint(FIXTURES / "xs"))
    assert xs.layer_num_heads == (4, 8, 8, 8) and xs.layer_sliding == (False, True, True, True)
    assert xs.rotary_dim == 8 and xs.gate_proj == "softplus_head"
    assert model_config(open_checkpoint(FIXTURES / "m")).gate_proj == "softplus"


@pytest.mark.parametrize(("case", "fmt"), FORMATS)
def test_engine_greedy_tokens_equal_transformers(case: str, fmt: str, gguf_dir: str) -> None:
    engine = engine_for(PARITY.path(case, fmt, gguf_dir))
    [result] = engine.generate([PARITY.tokens[: PARITY.prompt_len]], GREEDY)
    assert result["token_ids"] == PARITY.reference(case, "greedy").tolist()


@pytest.mark.parametrize("case", CASES)
def test_numba_engine_generates_what_numpy_does(case: str) -> None:
    numba_engine_equals_numpy(FIXTURES / case, PARITY.tokens[: PARITY.prompt_len])


@pytest.mark.parametrize("case", CASES)
def test_a_sequence_decodes_the_same_alone_and_in_a_batch_of_eight(case: str) -> None:
    batch_of_eight_equals_alone(engine_for(FIXTURES / case, kernels="numba"))
