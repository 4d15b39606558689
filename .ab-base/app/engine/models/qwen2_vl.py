"""Qwen2.5-VL's text side: the Qwen 2 block (q/k/v biases) with multimodal RoPE.

M-RoPE splits the head's frequencies into t/h/w sections (`mrope_section`, e.g. 16/24/24 of 64);
each section rotates by its own position id. Text tokens have all three equal, so a text-only
prompt is plain 1D RoPE; image tokens take their grid coordinates (models/mrope.py).

Checkpoints say it two ways: transformers 5 writes `text_config.rope_parameters.mrope_section`,
the published folders a flat config with `rope_scaling: {"type": "mrope", "mrope_section": ...}`
(a RoPE type that is no frequency scaling at all, so it is taken out before the shared parser).
llama.cpp's GGUFs (architecture `qwen2vl`, Qwen2-VL's and Qwen2.5-VL's text side alike) store the
sections as `qwen2vl.rope.dimension_sections`, padded to four with a zero.
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.config import ModelConfig, common_from_gguf, common_from_hf
from app.engine.models.family import Family


def mrope_section(text: dict[str, Any]) -> tuple[int, ...]:
    for key in ("rope_parameters", "rope_scaling"):
        params = text.get(key) or {}
        if "mrope_section" in params:
            section = params["mrope_section"]
            if not (
                isinstance(section, list)
                and len(section) == 3
                and all(isinstance(v, int) and v > 0 for v in section)
            ):
                raise CheckpointError(
                    f"config.json {key}.mrope_section is {section!r}: expected 3 positive whole numbers"
                )
            return tuple(section)
    raise CheckpointError(
        "config.json has no rope_parameters.mrope_section (Qwen2.5-VL's t/h/w split of the frequencies)"
    )


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return mrope_config_from_hf(cfg, "qwen2vl", qkv_bias=True)


def mrope_config_from_hf(cfg: dict[str, Any], architecture: str, **fields: Any) -> ModelConfig:
    """The shared keys plus the M-RoPE sections, from either config layout (PaddleOCR-VL's text
    side reads its config.json the same way); `fields`: the family's own ModelConfig fields."""
    text = dict(cfg.get("text_config") or cfg)
    section = mrope_section(text)
    for key in ("rope_scaling", "rope_parameters"):
        params = text.get(key) or {}
        if (params.get("type") or params.get("rope_type")) in ("mrope", "default"):
            text[key] = {k: v for k, v in params.items() if k not in ("type", "rope_type", "mrope_section")}
    config = ModelConfig(**common_from_hf(text, architecture), mrope_section=section, **fields)
    return _check_sections(config, section, "config.json mrope_section")


def _check_sections(config: ModelConfig, section: tuple[int, ...], key: str) -> ModelConfig:
    if 2 * sum(section) != config.head_dim:
        raise CheckpointError(
            f"{key} {list(section)} sums to {sum(section)}, not half the head size {config.head_dim}"
        )
    return config


def gguf_mrope_section(meta: dict[str, Any]) -> tuple[int, ...]:
    """`[t, h, w, 0]` -> (t, h, w). A fourth section (Qwen3-VL's interleaved M-RoPE) is refused."""
    key = f"{meta['general.architecture']}.rope.dimension_sections"
    section = meta.get(key)
    if section is None:
        raise CheckpointError(f"metadata has no {key} (Qwen2-VL's t/h/w split of the RoPE frequencies)")
    if not (
        isinstance(section, list)
        and 3 <= len(section) <= 4
        and all(isinstance(v, int) and v >= 0 for v in section)
        and all(v > 0 for v in section[:3])
    ):
        raise CheckpointError(f"{key} is {section!r}: expected 3 positive whole numbers and a 0")
    if len(section) == 4 and section[3]:
        raise CheckpointError(
            f"{key} is {section}: a fourth M-RoPE section is not supported (Qwen2-VL and Qwen2.5-VL use three)"
        )
    return tuple(section[:3])


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return mrope_config_from_gguf(meta, vocab_size, qkv_bias=True)


def mrope_config_from_gguf(meta: dict[str, Any], vocab_size: int, **fields: Any) -> ModelConfig:
    section = gguf_mrope_section(meta)
    config = ModelConfig(**common_from_gguf(meta, vocab_size), mrope_section=section, **fields)
    return _check_sections(config, section, f"{meta['general.architecture']}.rope.dimension_sections")


FAMILY = Family(
    gguf_arch="qwen2vl",
    hf_architectures=("Qwen2_5_VLForConditionalGeneration",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
