"""Write a Gemma 4 audio mmproj GGUF from a Hugging Face folder at test time, the way llama.cpp's converter
(convert_hf_to_gguf.py's `Gemma4VisionAudioModel`) writes its audio half: `model.audio_tower.` renamed to
`conformer.`, clipped linears' `.linear.` dropped, scalars as one-element vectors, `per_dim_scale` through
softplus, the depthwise kernel as `[hidden, K]`, names from gguf-py's own tensor map, the `clip.audio.*`
keys its MmprojModel writes, convolutions F32. Only gguf-py and numpy: no torch."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

BOUNDS = (".input_max", ".input_min", ".output_max", ".output_min")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    body = memoryview(raw)[8 + size :]
    return {
        name: np.frombuffer(body[slice(*info["data_offsets"])], np.float32).reshape(info["shape"])
        for name, info in header.items()
        if name != "__metadata__"
    }


def write_audio_mmproj(
    folder: Path, out: Path, drop: str | None = None, replace: dict[str, np.ndarray] | None = None
) -> None:
    """`drop`: a GGUF tensor name left out; `replace`: GGUF tensor names written with other values (to test
    the loader's errors)."""
    config = json.loads((folder / "config.json").read_text())
    audio = config["audio_config"]
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_clip_has_audio_encoder(True)
    writer.add_clip_audio_projector_type(gguf.VisionProjectorType.GEMMA4A)
    writer.add_audio_projection_dim(config["text_config"]["hidden_size"])
    writer.add_audio_embedding_length(audio["hidden_size"])
    writer.add_audio_feed_forward_length(audio["hidden_size"] * 4)
    writer.add_audio_block_count(audio["num_hidden_layers"])
    writer.add_audio_head_count(audio["num_attention_heads"])
    writer.add_audio_num_mel_bins(128)
    writer.add_audio_attention_layernorm_eps(1e-6)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, audio["num_hidden_layers"])
    for hf_name, data in read_safetensors(folder / "model.safetensors").items():
        if "audio_tower" not in hf_name and "embed_audio" not in hf_name:
            continue
        name = hf_name.replace("model.audio_tower.", "conformer.").replace(".linear.", ".")
        if name.endswith("per_dim_scale"):
            name, data = name + ".weight", np.logaddexp(0, data).astype(np.float32)  # softplus
        if "lconv1d.depthwise_conv1d" in name and name.endswith(".weight"):
            data = data.reshape(data.shape[0], data.shape[2])
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias", *BOUNDS))
        assert mapped is not None, f"no GGUF name for {hf_name}"
        if mapped != drop:
            writer.add_tensor(mapped, np.ascontiguousarray((replace or {}).get(mapped, data), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
