"""Write a Gemma 4 vision mmproj GGUF from a Hugging Face folder at test time, as llama.cpp's converter
(`Gemma4VisionAudioModel` over `MmprojModel`) writes one: arch `clip`, projector type `gemma4v`, the
`clip.vision.*` keys it writes (image size 224, unused), the encoder's layers renamed to
`vision_model.model.*` and every name mapped by gguf-py's own table, `.linear.weight` shortened to `.weight`,
scalars (the clipped linears' bounds) as 1-element tensors, the patch embedding `[hidden, p*p*3]` permuted to
the convolution kernel `[hidden, 3, p, p]`. Float32 throughout, so the pair is exact.

The converter writes no pooling size (llama.cpp takes 3), KV head count (the query heads'), or soft-token
budget: the tiny models differ there, so `clip.vision.projector.scale_factor`,
`clip.vision.attention.head_count_kv` and `clip.vision.image_max_pixels` (keys clip.cpp reads) are added.
Only gguf-py and numpy: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gemma4_gguf import read_hf, write_gguf

GQ = gguf.GGMLQuantizationType
IMAGE_TOKENS = {256: "<|image>", 257: "<image|>", 258: "<|image|>"}
_SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")


def gguf_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The vision side's tensors under their mmproj names, in the mmproj's layout."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 64)
    out = {}
    for hf_name, data in tensors.items():
        if not hf_name.startswith(("model.vision_tower.", "model.embed_vision.")):
            continue
        if data.ndim == 0:
            data = data.reshape(1)
        name = hf_name.replace("model.vision_tower.encoder.", "vision_model.model.")
        name = name.replace(".linear.weight", ".weight")
        if name.endswith("position_embedding_table"):
            name += ".weight"
        if name.endswith("patch_embedder.input_proj.weight"):
            n, k = data.shape
            p = round((k // 3) ** 0.5)
            data = data.reshape(n, p, p, 3).transpose(0, 3, 1, 2)
        mapped = names.get_name(name, try_suffixes=_SUFFIXES)
        if mapped is None:
            raise KeyError(f"no mmproj name for {hf_name}")
        out[mapped] = np.ascontiguousarray(data, np.float32)
    return out


def write_mmproj(folder: Path, out: Path, drop: tuple[str, ...] = (), reshape: dict | None = None) -> None:
    """The mmproj of `folder`'s vision tower; `drop` leaves tensors out, `reshape` (name -> shape)
    writes a tensor misshapen: the corrupt files the loader must name."""
    cfg, tensors = read_hf(folder)
    vision, text = cfg["vision_config"], cfg.get("text_config") or {}
    processor_file = folder / "preprocessor_config.json"
    processor = json.loads(processor_file.read_text()) if processor_file.exists() else {}
    pooling = vision.get("pooling_kernel_size", 3)
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text["hidden_size"])
    writer.add_vision_image_size(224)
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(processor.get("image_mean", [0.0, 0.0, 0.0]))
    writer.add_vision_image_std(processor.get("image_std", [1.0, 1.0, 1.0]))
    writer.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA4V)
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    # what the tiny models do not share with llama.cpp's defaults
    writer.add_uint32("clip.vision.projector.scale_factor", pooling)
    writer.add_uint32("clip.vision.attention.head_count_kv", vision["num_key_value_heads"])
    budget = processor.get("max_soft_tokens", 280)
    writer.add_uint32("clip.vision.image_max_pixels", budget * (vision["patch_size"] * pooling) ** 2)
    for name, data in gguf_tensors(tensors).items():
        if name in drop:
            continue
        if reshape and name in reshape:
            data = np.resize(data, reshape[name])
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_pair(folder: Path, out_dir: Path) -> Path:
    """A Gemma4ForConditionalGeneration folder as llama.cpp publishes it: the text GGUF (with the image
    tokens in its vocabulary) and `mmproj-*.gguf` beside it. The text GGUF's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = out_dir / "tiny-gemma4-f32.gguf"
    write_gguf(folder, model, GQ.F32, IMAGE_TOKENS)
    write_mmproj(folder, out_dir / "mmproj-tiny-gemma4-f32.gguf")
    return model
