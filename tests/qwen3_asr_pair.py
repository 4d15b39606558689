"""llama.cpp's pair for the tiny Qwen3-ASR of tests/fixtures/qwen3_asr, written with gguf-py as its
convert_hf_to_gguf.py writes it (Qwen3ASRTextModel, Qwen3ASRMmprojModel): the audio tensors under `a.*` /
`mm.a.mlp.*`, the convolutions' weights forced to F16 (Qwen25AudioModel.tensor_force_quant) and their biases
reshaped to `[C, 1, 1]`, the generated position sinusoids, the `clip.audio.*` keys and
`clip.audio.projector_type` qwen3a; the text model as a `qwen3vl` GGUF under llama.cpp's names, with its
vocabulary and `<|im_end|>` as BOS and EOS. The tests that load it share it from here.

The mmproj is checked against the converter's own (tests/fixtures/qwen3_asr/gguf/, made by
tests/fixtures/make_qwen3_asr_mmproj.py): the same tensors, types, shapes and bytes, and the same `clip.*`
keys. The converter cannot write the text side of this fixture (its tokenizer is no pre-tokenizer it knows),
so that side is written here as Qwen3ASRTextModel writes one: `qwen3vl` keys, Qwen3's tensor names."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from app.engine.loader.names import gguf_name
from app.engine.loader.safetensors import read_safetensors_file

FIXTURES = Path(__file__).parent / "fixtures"
HF = FIXTURES / "qwen3_asr" / "hf"
CONFIG = json.loads((HF / "config.json").read_text())
TEXT_NAME = "qwen3-asr-tiny-f32.gguf"
MMPROJ_NAME = "mmproj-qwen3-asr-tiny-f32.gguf"

_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.out_proj": "attn_out", "self_attn_layer_norm": "ln1", "final_layer_norm": "ln2",
          "fc1": "ffn_up", "fc2": "ffn_down"}  # fmt: skip


def _hf_tensors() -> dict[str, np.ndarray]:
    return {
        n: t.dequantize().astype(np.float32)
        for n, t in read_safetensors_file(HF / "model.safetensors").items()
    }


def _mmproj_name(hf: str) -> str | None:
    """The converter's name for an HF audio tensor (its TensorNameMap for the qwen3omni audio tower)."""
    bare = hf.removeprefix("model.")
    stem, suffix = bare.rsplit(".", 1)
    if stem.startswith("multi_modal_projector.linear_"):  # the original layout's audio_tower.proj{1,2}
        return f"mm.a.mlp.{stem[-1]}.{suffix}"
    if stem.startswith("audio_tower.conv2d"):
        return f"a.conv2d.{stem[-1]}.{suffix}"
    if stem == "audio_tower.conv_out":
        return f"a.conv_out.{suffix}"
    if stem == "audio_tower.ln_post":
        return f"a.post_ln.{suffix}"
    if stem.startswith("audio_tower.layers."):
        _, _, index, part = stem.split(".", 3)
        return f"a.blk.{index}.{_BLOCK[part]}.{suffix}"
    return None


def write_mmproj(
    path: Path,
    drop: str | None = None,
    projector: str = "qwen3a",
    replace: dict[str, np.ndarray] | None = None,
) -> None:
    """The mmproj; for the tests of broken files, without the tensor `drop`, under another projector type,
    or with tensors `replace`d (given as written; a name the converter does not write is added)."""
    audio = CONFIG["audio_config"]
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_uint32("clip.audio.projection_dim", CONFIG["text_config"]["hidden_size"])
    writer.add_uint32("clip.audio.embedding_length", audio["d_model"])
    writer.add_uint32("clip.audio.feed_forward_length", audio["encoder_ffn_dim"])
    writer.add_uint32("clip.audio.block_count", audio["encoder_layers"])
    writer.add_uint32("clip.audio.attention.head_count", audio["encoder_attention_heads"])
    writer.add_uint32("clip.audio.num_mel_bins", audio["num_mel_bins"])
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_string("clip.audio.projector_type", projector)
    for hf, values in _hf_tensors().items():
        name = _mmproj_name(hf)
        if name is None or name == drop:
            continue
        if name.startswith("a.conv2d.") and name.endswith(".bias"):
            values = values[:, None, None]
        if ".conv" in hf and hf.endswith(".weight"):  # Qwen25AudioModel.tensor_force_quant
            values = values.astype(np.float16)
        writer.add_tensor(name, (replace or {}).get(name, values))
    written = {_mmproj_name(hf) for hf in _hf_tensors()}
    for name, values in (replace or {}).items():
        if name not in written:
            writer.add_tensor(name, values)
    d = audio["d_model"]  # generate_extra_tensors: Whisper's sinusoids for 1500 positions
    inv = np.exp(-float(np.log(10_000)) / (d // 2 - 1) * np.arange(d // 2, dtype=np.float32))
    scaled = np.arange(1500, dtype=np.float32)[:, None] * inv[None, :]
    writer.add_tensor(
        "a.position_embd.weight", np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)
    )
    _finish(writer)


def write_text(path: Path) -> None:
    from tokenizers import Tokenizer

    text = CONFIG["text_config"]
    writer = gguf.GGUFWriter(str(path), "qwen3vl")
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_block_count(text["num_hidden_layers"])
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_rope_freq_base(text["rope_parameters"]["rope_theta"])
    writer.add_uint32("qwen3vl.n_deepstack_layers", 0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokenizer = Tokenizer.from_file(str(HF / "tokenizer.json"))
    vocab = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    size = text["vocab_size"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([vocab[i] for i in range(size)])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if vocab[i] in specials else gguf.TokenType.NORMAL for i in range(size)]
    )
    writer.add_token_merges([])
    im_end = tokenizer.token_to_id("<|im_end|>")
    writer.add_bos_token_id(im_end)  # Qwen3ASRTextModel.set_vocab: both <|im_end|>
    writer.add_eos_token_id(im_end)
    writer.add_pad_token_id(tokenizer.token_to_id("<|endoftext|>"))
    for hf, values in _hf_tensors().items():
        if ".language_model." in hf:
            writer.add_tensor(gguf_name(hf, "qwen3"), values)
    _finish(writer)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_pair(folder: Path) -> Path:
    """The text GGUF and its mmproj in `folder`; the text GGUF's path."""
    write_text(folder / TEXT_NAME)
    write_mmproj(folder / MMPROJ_NAME)
    return folder / TEXT_NAME
