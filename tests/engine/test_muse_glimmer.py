"""Muse Glimmer (text) against transformers 5.24, on tiny random-weight checkpoints.

tests/fixtures/muse_glimmer/ holds two Hugging Face folders made by
tests/fixtures/make_muse_glimmer_reference.py (run in .venv-ref; this test never imports torch or
transformers) and transformers' float32 logits at every position of a 40-token sequence (several sliding
windows of 8), plus its greedy continuation of the first 32 tokens:

- `base`: transformers' default layer kinds (every 4th layer from the last full and without RoPE), the
  embedding norm, centred sandwich norms with their own post epsilon, scale-less QK norms times
  `qk_scale_factor`, the sigmoid gate from `gate_proj`, logits times `output_multiplier`, softcapped;
- `theta`: alternating layers, tied embeddings and an explicit `layer_rope_theta` with a NoPE sliding
  layer, which llama.cpp's layout cannot say (it rotates exactly the sliding layers): no GGUF case.

Each runs from the HF folder and (but `theta`) from a GGUF written here, at test time, in llama.cpp's
`muse-glimmer` layout (tests/engine/muse_glimmer_gguf.py: permuted q/k rows, the QK scale as the query
norm's weight), on the numpy reference and the numba CPU kernels. Both sides compute in float32 from the same
(bfloat16) weights: within tests/engine/test_families.py's bound of 1e-5 of the logit scale (measured:
<= 5.1e-6); a missing embedding norm, NoPE layer or gate moves logits by percents. Greedy tokens equal at
every position; the first generated token's top-5 log-probs within 1e-3.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from family_parity import (
    GREEDY,
    ParityFixtures,
    batch_of_eight_equals_alone,
    engine_for,
    numba_engine_equals_numpy,
)
from model_harness import MODES
from muse_glimmer_gguf import write_gguf

from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import model_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "muse_glimmer"
PARITY = ParityFixtures(FIXTURES, write_gguf)
CASES = PARITY.cases


def _llama_cpp_can_say(text: dict) -> bool:
    """llama.cpp rotates exactly the sliding layers: a config whose NoPE layers are others has no GGUF."""
    thetas = text.get("layer_rope_theta")
    types = text.get("layer_types")
    return (
        thetas is None
        or types is None
        or [not t for t in thetas] == [k != "sliding_attention" for k in types]
    )


GGUF_CASES = [c for c in CASES if _llama_cpp_can_say(PARITY.manifest["cases"][c]["config"]["text_config"])]
FORMATS = [(case, "hf") for case in CASES] + [(case, "gguf") for case in GGUF_CASES]
RTOL = 1e-5


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("muse-glimmer-gguf"))


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("case", "fmt"), FORMATS)
def test_logits_match_transformers(case: str, fmt: str, mode: str, kernels: str, gguf_dir: str) -> None:
    PARITY.check_logits(
        case, PARITY.path(case, fmt, gguf_dir), f"{fmt}, {mode}, {kernels}", mode, kernels, RTOL
    )


def test_both_formats_read_the_same_layers(gguf_dir: str) -> None:
    """Sliding and NoPE layers, softcap and output multiplier from the GGUF's keys as from config.json; the
    theta case's NoPE sliding layer comes from layer_rope_theta."""
    fields = ("layer_sliding", "layer_nope", "sliding_window", "final_softcap", "logit_scale", "gate_proj",
              "embedding_norm", "post_norm_eps")  # fmt: skip
    for case in GGUF_CASES:
        hf = model_config(open_checkpoint(FIXTURES / case))
        gguf = model_config(open_checkpoint(PARITY.path(case, "gguf", gguf_dir)))
        assert {f: getattr(gguf, f) for f in fields} == {f: getattr(hf, f) for f in fields}, case
        assert gguf.rope_interleaved and not hf.rope_interleaved
    base = model_config(open_checkpoint(FIXTURES / "base"))
    assert base.layer_sliding == (True, False, True, True, True, False)
    assert base.layer_nope == tuple(not s for s in base.layer_sliding)
    theta = model_config(open_checkpoint(FIXTURES / "theta"))
    assert theta.layer_nope == (False, True, True, False, False, True) and theta.layer_sliding[2]


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
