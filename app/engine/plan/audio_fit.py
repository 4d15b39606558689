"""The audio tower's share of will-it-fit (Qwen3-ASR's, models/audio/qwen3_asr.py): its weights as stored and
its working set to encode the longest clip the speech model takes, beside the vision tower's (vision_fit.py).

The encoder runs in three stages, one after the other, so the working set is the largest of them:
- the convolutions, CONV_CHUNKS chunks at a time: the second one gathers channels x 9 taps for each of its
  output positions (a quarter of the mel bins by a quarter of the chunk's frames), and the product takes
  a transposed copy of them: 2 x chunks x channels x 9 x positions floats;
- each encoder layer over all of the clip's positions: 6 x d_model (residual, normed copy, q, k, v, the
  attention output) and 2 x ffn floats per position, beside one batch of WINDOW_BATCH windows' scores
  (heads x window^2 each);
- the projector's two layers over the positions (their widths are the text model's, well under the above).
A clip is at most as many positions as the task model's context (`audio_context`): each soft token is
one encoder position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT_BYTES = 4
ASR_CONTEXT = 8192  # a speech model's context, prompt + reply: 13 audio tokens a second, about eight minutes


@dataclass(frozen=True)
class AudioShape:
    weight_bytes: int  # the tower's and its projector's tensors, as stored
    hidden_size: int  # d_model
    num_heads: int
    ffn_size: int
    conv_channels: int
    mel_bins: int
    chunk_frames: int
    window_positions: int  # encoder positions one attention window spans
    max_positions: int  # the longest clip's positions (the speech model's context)
    source: str  # where the tower's weights are: the folder's safetensors

    def activation_bytes(self) -> int:
        from app.engine.models.audio.qwen3_asr import CONV_CHUNKS, WINDOW_BATCH

        positions = -(-self.mel_bins // 4) * -(-self.chunk_frames // 4)  # the second convolution's outputs
        convolutions = 2 * CONV_CHUNKS * self.conv_channels * 9 * positions
        layer = self.max_positions * (6 * self.hidden_size + 2 * self.ffn_size)
        windows = min(WINDOW_BATCH, -(-self.max_positions // self.window_positions))
        scores = windows * self.num_heads * self.window_positions**2
        return max(convolutions, layer + scores) * FLOAT_BYTES


def is_audio_tensor(hf_name: str, config: Mapping[str, Any]) -> bool:
    """A Hugging Face tensor of a speech model's audio side (its tower and the projector into the text
    model), by its name; other families' projectors are the vision side's (vision_fit.is_vision_tensor)."""
    from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr

    name = hf_name.removeprefix("model.")
    return is_qwen3_asr(dict(config)) and name.startswith(("audio_tower.", "multi_modal_projector."))


def audio_from_folder(
    folder: Path, config: Mapping[str, Any], weight_bytes: int, context: int = ASR_CONTEXT
) -> AudioShape | None:
    """A Qwen3-ASR folder's tower (None for any other model), sized for clips of up to `context` tokens."""
    from app.engine.models.audio.qwen3_asr import audio_tokens
    from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr, qwen3_asr_audio_config

    if not is_qwen3_asr(dict(config)):
        return None
    cfg = qwen3_asr_audio_config(folder, dict(config))
    return AudioShape(
        weight_bytes=int(weight_bytes),
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        ffn_size=cfg.ffn_size,
        conv_channels=cfg.conv_channels,
        mel_bins=cfg.num_mel_bins,
        chunk_frames=cfg.chunk_frames,
        window_positions=audio_tokens(cfg.chunk_frames, cfg) * (cfg.n_window_infer // cfg.chunk_frames),
        max_positions=int(context),
        source=f"{folder.name}/*.safetensors",
    )
