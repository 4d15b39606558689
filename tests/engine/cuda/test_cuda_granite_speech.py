"""Granite Speech's audio side on CUDA against the numpy backend (tests/fixtures/granite_speech, tiny random
weights): the conformer's states and the Q-Former's audio embeddings for the spoken clip and its 0.3 s cut.
(The fixture's text model has head_dim 16, below the CUDA attention kernels' smallest: the decoder is not
run here.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).parents[2] / "fixtures" / "granite_speech"
HF = FIXTURES / "hf"


@pytest.mark.parametrize("clip", ["speech", "short"])
def test_encoder_and_projector_match_numpy(clip, cuda, cpu) -> None:
    from app.engine.models.audio import load_audio_encoder

    config = json.loads((HF / "config.json").read_text())
    ours, reference = load_audio_encoder(HF, config, cuda), load_audio_encoder(HF, config, cpu)
    with np.load(FIXTURES / "references.npz") as refs:
        features = refs[f"features/{clip}"]
    for got, want in ((ours.encoder_states(features), reference.encoder_states(features)),
                      (ours.encode(features), reference.encode(features))):  # fmt: skip
        want = np.asarray(want)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(cuda.to_host(got), want, rtol=0, atol=2e-3 * scale, err_msg=clip)
