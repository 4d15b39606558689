"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet hybrids) against transformers 5.24.

tests/fixtures/hybrid/<family>/ holds a tiny random-weight HF folder per family and transformers'
float32 outputs for a 72-token sequence (tests/fixtures/make_qwen35_reference.py made them); the
GGUFs are written here at test time in llama.cpp's layout (hybrid_gguf.py: Qwen3.5's tiled value
heads, Qwen3-Next's split qkvz, `1 + w` norms, -exp(A_log)). The model runs at the model level
(DecoderModel.forward with hand-built metadata and state arrays), in the ways the engine schedules
it: one prefill (the chunked delta rule over two 64-token chunks), chunked prefill (13, 11, then
the rest: chunks continue the conv and recurrent states), then decode one token at a time (the
recurrent form), and batches of sequences of different lengths sharing steps; then through the engine
(LLMEngine: a 16-token prefill budget, state slots, a prefix hit resuming from a state snapshot), on
the numpy backend and on the numba one.

Tolerance: logits within 5e-5 x the case's logit scale (float32 summation order over the chunked and
recurrent forms of the delta rule; measured on numpy and numba: one prefill <= 8.8e-6, chunked prefill
<= 1.9e-5, decode <= 7.4e-7 x scale); first-step top-5 log-probs within 1e-3 (measured <= 6e-6).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GQ
from hybrid_gguf import write_qwen_gguf  # sibling module: pytest puts tests/engine on sys.path

from app.engine.backend import cpu_backend
from app.engine.backend.base import AttentionMetadata
from app.engine.backend.recurrent_reference import delta_rule_chunked, delta_rule_recurrent, gated_delta_rule
from app.engine.loader.names import CheckpointError
from app.engine.loader.tokenizer import bytes_to_unicode
from app.engine.loader.weights import open_checkpoint
from app.engine.models.config import MIXER_ATTENTION, MIXER_GATED_DELTANET
from app.engine.models.decoder import DecoderModel
from app.engine.models.registry import build_model, family, model_config
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"
FAMILIES = ("qwen35", "qwen3next", "qwen35moe")
SOURCES = ("hf", "gguf")
RTOL = 5e-5
BLOCK = 8
MAX_POSITIONS = 256
CHUNKS = (13, 11)  # then the rest: a small prefill budget


def manifest(fam: str) -> dict[str, Any]:
    return json.loads((FIXTURES / fam / "manifest.json").read_text(encoding="utf-8"))


@functools.cache
def reference(fam: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / fam / "references.npz") as refs:
        return dict(refs)


def _quantized(name: str, data: np.ndarray) -> GQ:
    """Q8_0 for the projections (whole rows of 32-weight blocks), Q4_0 for the MLP, F32 for the rest."""
    if data.ndim < 2 or data.shape[-1] % 32:
        return GQ.F32
    return GQ.Q4_0 if ".ffn_" in name else GQ.Q8_0


_FLOAT_TYPES = {
    "bf16": None,
    "f16": lambda name, data: GQ.F16 if data.ndim > 1 else GQ.F32,
    "quantized": _quantized,
    "legacy": None,
    "mtp": None,
}


@functools.cache
def gguf_path(fam: str, tmp_root: str, kind: str = "bf16") -> Path:
    path = Path(tmp_root) / f"{fam}-{kind}.gguf"
    return write_qwen_gguf(
        FIXTURES / fam / "hf",
        fam,
        path,
        _FLOAT_TYPES[kind],
        legacy_ssm_in=kind == "legacy",
        mtp_block=kind == "mtp",
    )


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hybrid-gguf"))


@functools.cache
def model(fam: str, source: str, tmp_root: str, kernels: str = "numpy") -> DecoderModel:
    path = FIXTURES / fam / "hf" if source == "hf" else gguf_path(fam, tmp_root)
    return build_model(open_checkpoint(path), cpu_backend(kernels), MAX_POSITIONS)


class Runner:
    """Caches for one model (KV blocks per attention layer, state slots per recurrent layer) and the
    metadata of steps that each carry chunks of several sequences, placed as the engine places them."""

    def __init__(self, m: DecoderModel, slots: int = 9, blocks: int = 160) -> None:
        self.m, cfg, backend = m, m.config, m.backend
        rng = np.random.default_rng(0)
        self.caches: list[Any] = []
        for shapes in m.state_shapes():
            if shapes is None:
                k, v = backend.alloc_kv_cache(blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
                k[...], v[...] = rng.normal(0, 10, k.shape), rng.normal(0, 10, v.shape)  # reused blocks
                self.caches.append((k, v))
            else:  # a slot's old contents must not leak into a sequence that starts from zeros
                self.caches.append(tuple(rng.normal(0, 10, (slots, *s)).astype(np.float32) for s in shapes))
        self.free = list(rng.permutation(np.arange(1, blocks)))
        self.tables: dict[int, list[int]] = {}

    def step(self, chunks: list[tuple[int, list[int], int]]) -> list[np.ndarray]:
        """One forward over `(slot, new tokens, tokens already computed)` chunks; each chunk's logits."""
        qsl, positions, slots_map, lens = [0], [], [], []
        for slot, tokens, start in chunks:
            table = self.tables.setdefault(slot, [])
            while len(table) * BLOCK < start + len(tokens):
                table.append(int(self.free.pop()))
            pos = list(range(start, start + len(tokens)))
            qsl.append(qsl[-1] + len(tokens))
            positions += pos
            slots_map += [table[p // BLOCK] * BLOCK + p % BLOCK for p in pos]
            lens.append(start + len(tokens))
        width = max(len(self.tables[s]) for s, _, _ in chunks)
        tables = np.array(
            [self.tables[s] + [0] * (width - len(self.tables[s])) for s, _, _ in chunks], np.int32
        )
        q, seq_lens = np.array(qsl, np.int32), np.array(lens, np.int32)
        state_slots = np.array([s for s, _, _ in chunks], np.int32)
        initial = np.array([start > 0 for _, _, start in chunks])
        meta = AttentionMetadata(
            q, seq_lens, tables, np.array(slots_map, np.int32), np.array(positions, np.int32),
            max(len(t) for _, t, _ in chunks), int(seq_lens.max()), BLOCK,
            host_query_start_loc=q, host_seq_lens=seq_lens, state_slots=state_slots, has_initial_state=initial,
            host_state_slots=state_slots, host_has_initial_state=initial,
        )  # fmt: skip
        tokens = np.array([t for _, ts, _ in chunks for t in ts], np.int32)
        logits = np.asarray(self.m.logits(self.m.forward(tokens, meta, self.caches)), np.float32)
        return [logits[q[i] : q[i + 1]] for i in range(len(chunks))]


def chunked_then_greedy(
    m: DecoderModel, prompt: list[int], steps: int
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Prompt logits (prefill in CHUNKS), the greedy continuation, and the first decode step's logits."""
    run, start, rows = Runner(m), 0, []
    for n in [*CHUNKS, len(prompt)]:
        n = min(n, len(prompt) - start)
        if n:
            rows.append(run.step([(3, prompt[start : start + n], start)])[0])
            start += n
    greedy, first = [int(np.argmax(rows[-1][-1]))], None
    for _ in range(steps - 1):
        out = run.step([(3, [greedy[-1]], start)])[0][-1]
        first = out if first is None else first
        start += 1
        greedy.append(int(np.argmax(out)))
    return np.concatenate(rows), greedy, first


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_one_prefill_matches_transformers(fam: str, source: str, tmp_root: str) -> None:
    expected = reference(fam)["logits"]
    ours = Runner(model(fam, source, tmp_root)).step([(0, manifest(fam)["tokens"], 0)])[0]
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(ours - expected).max() <= RTOL * scale
    assert (ours.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_chunked_prefill_and_greedy_decode_match_transformers(fam: str, source: str, tmp_root: str) -> None:
    man, ref = manifest(fam), reference(fam)
    logits, greedy, second = chunked_then_greedy(
        model(fam, source, tmp_root), man["tokens"], len(man["greedy"])
    )
    scale = max(1.0, float(np.abs(ref["logits"]).max()))
    assert np.abs(logits - ref["logits"]).max() <= RTOL * scale
    assert greedy == man["greedy"]
    # transformers' first generated step reads the prompt's last logits; its second, our first decode
    first = log_softmax(logits[-1])
    top5 = np.argsort(-first, kind="stable")[:5]
    assert top5.tolist() == man["top5_ids"]
    assert np.abs(first[top5] - ref["top5_logprobs"]).max() <= 1e-3
    assert np.abs(second - ref["step_logits"][1]).max() <= RTOL * scale


@pytest.mark.parametrize("fam", FAMILIES)
def test_sequences_alone_and_in_a_batch_of_eight(fam: str, tmp_root: str) -> None:
    """Eight prompts of different lengths prefilled in shared steps (chunks of 9) then decoded together
    give each the greedy tokens it gets alone, from slots full of an earlier sequence's leftovers."""
    m, tokens = model(fam, "hf", tmp_root), manifest(fam)["tokens"]
    prompts = [tokens[i : i + n] for i, n in enumerate((5, 12, 17, 23, 30, 41, 52, 66))]
    steps = 6
    alone = [chunked_then_greedy(m, p, steps)[1] for p in prompts]
    run = Runner(m)
    done = [0] * 8
    seqs = [list(p) for p in prompts]
    while any(len(s) < len(p) + steps for s, p in zip(seqs, prompts, strict=True)):
        chunks, owners = [], []
        for i, s in enumerate(seqs):
            if len(s) == len(prompts[i]) + steps:
                continue
            n = min(9, len(s) - done[i])
            chunks.append((i, s[done[i] : done[i] + n], done[i]))
            owners.append(i)
        for i, out in zip(owners, run.step(chunks), strict=True):
            done[i] += len(chunks[owners.index(i)][1])
            if done[i] == len(seqs[i]):
                seqs[i].append(int(np.argmax(out[-1])))
    assert [s[len(p) :] for s, p in zip(seqs, prompts, strict=True)] == alone


@pytest.mark.parametrize(("fam", "kind"), [(f, k) for f in FAMILIES for k in ("bf16", "f16")])
def test_numba_backend(fam: str, kind: str, tmp_root: str) -> None:
    """The numba CPU backend (its products and attention; the recurrent layers' numpy ops inherited; the
    MoE fixtures' 48-wide rows stay on numpy products, the dense one's 64-wide rows run its kernels):
    from the BF16 GGUF (the reference's own weights) within the numpy bounds; from an F16 GGUF (weights
    rounded to float16) greedy still transformers', log-probs within 1e-2."""
    m = build_model(open_checkpoint(gguf_path(fam, tmp_root, kind)), cpu_backend("numba"), MAX_POSITIONS)
    man, ref = manifest(fam), reference(fam)
    logits, greedy, _ = chunked_then_greedy(m, man["tokens"], len(man["greedy"]))
    assert greedy == man["greedy"]
    first = log_softmax(logits[-1])
    exact = kind == "bf16"
    assert np.abs(first[man["top5_ids"]] - ref["top5_logprobs"]).max() <= (1e-3 if exact else 1e-2)
    if exact:
        assert np.abs(logits - ref["logits"]).max() <= RTOL * max(1.0, float(np.abs(ref["logits"]).max()))


@pytest.mark.parametrize("length", [1, 5, 64, 100, 130])
def test_chunked_and_recurrent_delta_rule_agree(length: int) -> None:
    rng = np.random.default_rng(length)
    h, dk, dv = 3, 8, 6
    q, k = (rng.normal(size=(h, length, dk)).astype(np.float32) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # unit keys, as the layer feeds the rule
    v = rng.normal(size=(h, length, dv)).astype(np.float32)
    g = -rng.uniform(0.0, 0.5, (h, length)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (h, length)).astype(np.float32)
    s0 = rng.normal(size=(h, dk, dv)).astype(np.float32)
    out_r, s_r = delta_rule_recurrent(np, q, k, v, g, beta, s0)
    out_c, s_c = delta_rule_chunked(np, q, k, v, g, beta, s0)
    assert np.abs(out_r - out_c).max() <= 1e-4 * max(1.0, float(np.abs(out_r).max()))
    assert np.abs(s_r - s_c).max() <= 1e-4 * max(1.0, float(np.abs(s_r).max()))
    # in two pieces, the state carried between them: the same as in one
    cut = length // 2
    first, s_mid = delta_rule_chunked(np, *(a[:, :cut] for a in (q, k, v, g, beta)), s0)
    second, s_end = delta_rule_chunked(np, *(a[:, cut:] for a in (q, k, v, g, beta)), s_mid)
    assert np.abs(np.concatenate([first, second], axis=1) - out_r).max() <= 1e-4 * max(
        1.0, float(np.abs(out_r).max())
    )
    assert np.abs(s_end - s_r).max() <= 1e-4 * max(1.0, float(np.abs(s_r).max()))


def test_tiled_value_heads_are_the_grouped_ones_reordered() -> None:
    """llama.cpp's tiled order is a permutation of the value heads: the same outputs, permuted."""
    rng = np.random.default_rng(7)
    t, hk, r, d = 10, 2, 3, 4
    q, k = (rng.normal(size=(t, hk, d)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(t, hk * r, d)).astype(np.float32)
    g = -rng.uniform(0, 1, (t, hk * r)).astype(np.float32)
    beta = rng.uniform(0, 1, (t, hk * r)).astype(np.float32)
    perm = np.arange(hk * r).reshape(hk, r).T.reshape(-1)  # tiled position j holds grouped head perm[j]
    meta = AttentionMetadata(
        np.array([0, t], np.int32), np.array([t], np.int32), np.zeros((1, 1), np.int32), np.zeros(t, np.int32),
        np.arange(t, dtype=np.int32), t, t, 16, host_query_start_loc=np.array([0, t]),
        host_state_slots=np.array([0]), host_has_initial_state=np.array([False]),
    )  # fmt: skip
    grouped = gated_delta_rule(np, q, k, v, g, beta, np.zeros((1, hk * r, d, d), np.float32), meta)
    tiled = gated_delta_rule(
        np, q, k, v[:, perm], g[:, perm], beta[:, perm], np.zeros((1, hk * r, d, d), np.float32), meta, True
    )
    np.testing.assert_allclose(tiled, grouped[:, perm], rtol=1e-5, atol=1e-6)


# -- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_config_from_both_sources(fam: str, tmp_root: str) -> None:
    hf = model_config(open_checkpoint(FIXTURES / fam / "hf"))
    gg = model_config(open_checkpoint(gguf_path(fam, tmp_root)))
    kinds = {"linear_attention": MIXER_GATED_DELTANET, "full_attention": MIXER_ATTENTION}
    assert hf.layer_mixers == gg.layer_mixers == tuple(kinds[t] for t in manifest(fam)["layer_types"])
    assert hf.rotary_dim == gg.rotary_dim == 4 and hf.attn_output_gate and gg.attn_output_gate
    assert hf.gated_deltanet.tiled_v_heads is False
    assert gg.gated_deltanet.tiled_v_heads is (fam != "qwen3next")
    assert (hf.gated_deltanet.num_k_heads, hf.gated_deltanet.num_v_heads) == (2, 4)
    if fam != "qwen35":
        assert hf.moe == gg.moe and hf.moe.shared_intermediate_size == 32 and hf.moe.shared_gate


def test_multimodal_wrapper_and_interval_configs() -> None:
    """Qwen3_5ForConditionalGeneration keeps the decoder under text_config; older configs give the
    layer pattern as full_attention_interval."""
    text = json.loads((FIXTURES / "qwen35" / "hf" / "config.json").read_text(encoding="utf-8"))
    text.pop("layer_types")
    text["full_attention_interval"] = 4
    wrapped = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
    }
    cfg = family("Qwen3_5ForConditionalGeneration").config_from_hf(wrapped)
    assert cfg.layer_mixers == (MIXER_GATED_DELTANET,) * 3 + (MIXER_ATTENTION,)
    # the M-RoPE sections of the multimodal model (text positions are equal in all three: plain RoPE)
    text["rope_parameters"] = {**text["rope_parameters"], "rope_type": "mrope", "mrope_section": [1, 1, 0],
                               "mrope_interleaved": True}  # fmt: skip
    sectioned = family("Qwen3_5ForConditionalGeneration").config_from_hf(wrapped)
    assert (sectioned.rotary_dim, sectioned.rope_scaling, sectioned.mrope_section) == (4, None, ())
    bad = {
        **text,
        "layer_types": ["linear_attention", "sliding_attention", "full_attention", "full_attention"],
    }
    with pytest.raises(CheckpointError, match="layer_types"):
        family("qwen35").config_from_hf(bad)


def test_gguf_with_an_mtp_block_runs_the_layers_before_it(tmp_root: str) -> None:
    """llama.cpp's converter appends Qwen3.5's multi-token-prediction block (nextn_predict_layers 1):
    the model runs the blocks before it, and gives transformers' logits."""
    checkpoint = open_checkpoint(gguf_path("qwen35", tmp_root, "mtp"))
    cfg = model_config(checkpoint)
    assert (cfg.num_layers, cfg.trailing_blocks) == (
        4,
        1,
    ) and "blk.4.nextn.eh_proj.weight" in checkpoint.tensors
    built = build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS)
    ours = Runner(built).step([(0, manifest("qwen35")["tokens"], 0)])[0]
    expected = reference("qwen35")["logits"]
    assert np.abs(ours - expected).max() <= RTOL * max(1.0, float(np.abs(expected).max()))
    meta = {**checkpoint.metadata, "qwen35.nextn_predict_layers": 5}
    with pytest.raises(CheckpointError, match="nextn_predict_layers"):
        family("qwen35").config_from_gguf(meta, checkpoint.tensors["token_embd.weight"].shape[0])


def test_fixtures_are_small() -> None:
    for fam in FAMILIES:
        size = sum(p.stat().st_size for p in (FIXTURES / fam).rglob("*") if p.is_file())
        assert size < 300_000, f"{fam}: {size} bytes"


def test_qwen35_xml_tool_calls_are_parsed() -> None:
    """Qwen3.5 / Qwen3-Next write `<function=...>` with one `<parameter=...>` per argument."""
    from app.engine.text.tool_calls import parse_tool_calls

    reply = (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParís\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"units": "c"}\n</parameter>\n</function>\n'
        "</tool_call>"
    )
    content, calls = parse_tool_calls(reply)
    assert content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "París", "days": 3, "opts": {"units": "c"}})
    ]
    assert (
        parse_tool_calls("<tool_call>\n<function=f>\nnot xml arguments</tool_call>")[1][0].arguments == "{}"
    )


# -- through the engine (scheduler, state slots, chunked prefill under a small token budget) ---------


def engine_folder(fam: str, tmp_root: str) -> Path:
    """The HF fixture plus a tokenizer.json (a byte-level BPE without merges: the engine loads one with
    every folder; the tests feed token ids)."""
    folder = Path(tmp_root) / f"{fam}-hf"
    if folder.exists():
        return folder
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to((FIXTURES / fam / "hf" / name).resolve())
    byte_char = bytes_to_unicode()
    byte_chars = [byte_char[b] for b in range(256)]
    vocab = {byte_chars[i]: i for i in range(json.loads((folder / "config.json").read_text())["vocab_size"])}
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}  # fmt: skip
    tokenizer = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": level,
                 "post_processor": None, "decoder": level, "model": model}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return folder


def make_engine(fam: str, source: str, tmp_root: str, **fields: Any) -> Any:
    from app.engine import EngineConfig
    from app.engine.core.engine import LLMEngine

    path = engine_folder(fam, tmp_root) if source == "hf" else gguf_path(fam, tmp_root)
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_model_len=256,
                                    max_num_seqs=8, max_num_batched_tokens=16, kv_cache_bytes=8 << 20,
                                    enable_prefix_caching=False)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


def greedy_params(n: int, logprobs: int | None = None) -> Any:
    from app.engine import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=logprobs)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_engine_greedy_and_top5_match_transformers(fam: str, source: str, tmp_root: str) -> None:
    """The 72-token prompt in chunks of 16 tokens, then decode: transformers' greedy tokens and
    first-step top-5 log-probs."""
    man, ref = manifest(fam), reference(fam)
    engine = make_engine(fam, source, tmp_root)
    assert engine.model_config.is_hybrid
    (result,) = engine.generate([man["tokens"]], greedy_params(len(man["greedy"]), logprobs=5))
    assert result["token_ids"] == man["greedy"]
    top = result["logprobs"][0].top
    assert [t for t, _ in top] == man["top5_ids"]
    assert np.abs(np.array([lp for _, lp in top]) - ref["top5_logprobs"]).max() <= 1e-3


@pytest.mark.parametrize(("fam", "source"), [("qwen35", "gguf"), ("qwen3next", "hf"), ("qwen35moe", "hf")])
def test_engine_batch_of_eight_matches_each_alone(fam: str, source: str, tmp_root: str) -> None:
    tokens = manifest(fam)["tokens"]
    prompts = [tokens[i : i + n] for i, n in enumerate((7, 70, 20, 33, 12, 58, 41, 26))]
    engine = make_engine(fam, source, tmp_root, max_num_batched_tokens=40)
    params = greedy_params(6)
    alone = [engine.generate([p], params)[0]["token_ids"] for p in prompts]
    together = engine.generate(prompts, params)
    assert [r["token_ids"] for r in together] == alone
    assert all(len(a) == 6 for a in alone)


def test_engine_prefix_hit_resumes_the_gated_deltanet_state(tmp_root: str) -> None:
    """A second request sharing 64 tokens resumes from the state snapshot the first left, and
    generates what a server without the prefix cache generates."""
    tokens = manifest("qwen35")["tokens"]
    first, second = tokens[:70], tokens[:64] + tokens[::-1][:6]
    params = greedy_params(8)
    expected = make_engine("qwen35", "hf", tmp_root).generate([second], params)[0]["token_ids"]
    engine = make_engine("qwen35", "hf", tmp_root, enable_prefix_caching=True, state_snapshot_interval=16)
    engine.generate([first], params)
    (result,) = engine.generate([second], params)
    assert result["num_cached_tokens"] >= 48
    assert result["token_ids"] == expected


@pytest.mark.parametrize(("fam", "kind"), [("qwen35", "quantized"), ("qwen3next", "legacy")])
def test_quantized_and_legacy_ggufs_equal_their_float_values(fam: str, kind: str, tmp_root: str) -> None:
    """Rows picked out of quantized tensors (the gated query's halves, Qwen3-Next's fused projections:
    `ssm_ba`, and `ssm_in` in older files) stay in their format: the model equals one built from the same
    file with every tensor dequantized to float32."""
    checkpoint = open_checkpoint(gguf_path(fam, tmp_root, kind))
    names = set(checkpoint.tensors)
    assert ("blk.0.ssm_in.weight" in names) is (kind == "legacy")
    if kind == "quantized":
        assert checkpoint.tensors["blk.1.attn_q.weight"].qtype.name == "Q8_0"
    floats = {
        n: QuantizedTensor.from_float(n, t.dequantize(), QUANT_TYPES["F32"])
        for n, t in checkpoint.tensors.items()
    }
    as_floats = dataclasses.replace(checkpoint, tensors=floats)
    tokens = manifest(fam)["tokens"]
    ours = Runner(build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS)).step([(0, tokens, 0)])[0]
    expected = Runner(build_model(as_floats, cpu_backend("numpy"), MAX_POSITIONS)).step([(0, tokens, 0)])[0]
    assert np.abs(ours - expected).max() <= 1e-5 * max(1.0, float(np.abs(expected).max()))
    if kind == "legacy":  # the float file's values are the HF ones: transformers' logits too
        ref = reference(fam)["logits"]
        assert np.abs(ours - ref).max() <= RTOL * max(1.0, float(np.abs(ref).max()))


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json as published (transformers 4 keys: rope_theta and
# partial_rotary_factor at the top level, the layer pattern as full_attention_interval).
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "decoder_sparse_step": 1, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 151936,
}  # fmt: skip


def test_released_qwen3_next_config() -> None:
    cfg = family("Qwen3NextForCausalLM").config_from_hf(QWEN3_NEXT_80B)
    assert cfg.layer_mixers == ((MIXER_GATED_DELTANET,) * 3 + (MIXER_ATTENTION,)) * 12
    assert (cfg.rotary_dim, cfg.rope_theta, cfg.head_dim) == (64, 1e7, 256)
    spec = cfg.gated_deltanet
    assert (spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim, spec.conv_kernel) == (
        16,
        32,
        128,
        128,
        4,
    )
    assert (cfg.moe.num_experts, cfg.moe.num_used, cfg.moe.intermediate_size) == (512, 10, 512)
    assert cfg.moe.shared_intermediate_size == 512 and cfg.moe.normalize
    # per sequence: 36 Gated DeltaNet layers, each a [8192, 3] conv state and a [32, 128, 128] state
    assert cfg.state_bytes_per_sequence == 36 * 4 * (8192 * 3 + 32 * 128 * 128)


def test_multimodal_checkpoint_runs_its_text_side(tmp_path: Path) -> None:
    """A Qwen3_5ForConditionalGeneration folder: the decoder under model.language_model., the config
    under text_config, a vision tower (model.visual.*) and MTP weights (mtp.*) beside it, skipped."""
    from app.engine.loader.safetensors import read_raw_tensors
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    source = FIXTURES / "qwen35" / "hf"
    text = json.loads((source / "config.json").read_text(encoding="utf-8"))
    wrapped = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text,
               "vision_config": {"depth": 1, "hidden_size": 8}, "tie_word_embeddings": True}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(wrapped), encoding="utf-8")
    tensors = {
        name.replace("model.", "model.language_model.", 1): StoredTensor(raw.dtype, raw.shape, raw.data)
        for name, raw in read_raw_tensors(source / "model.safetensors").items()
    }
    extra = np.ones((8, 8), np.float32)
    for name in ("model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight"):
        tensors[name] = StoredTensor("F32", extra.shape, extra)
    write_safetensors(tmp_path / "model.safetensors", tensors)
    checkpoint = open_checkpoint(tmp_path)
    assert checkpoint.architecture == "qwen35" and not any(
        "visual" in n or "mtp" in n for n in checkpoint.tensors
    )
    ours = Runner(build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS)).step(
        [(0, manifest("qwen35")["tokens"], 0)]
    )[0]
    expected = reference("qwen35")["logits"]
    assert np.abs(ours - expected).max() <= RTOL * max(1.0, float(np.abs(expected).max()))


@pytest.mark.parametrize("missing", ["blk.0.ssm_out.weight", "blk.0.ssm_beta.weight", "blk.0.ssm_a"])
def test_a_missing_gated_deltanet_tensor_is_named(missing: str, tmp_root: str) -> None:
    checkpoint = open_checkpoint(gguf_path("qwen35", tmp_root))
    broken = dataclasses.replace(
        checkpoint, tensors={n: t for n, t in checkpoint.tensors.items() if n != missing}
    )
    with pytest.raises(CheckpointError, match=f"'{missing}' is missing"):
        build_model(broken, cpu_backend("numpy"), MAX_POSITIONS)


@pytest.mark.parametrize("arch", FAMILIES)
def test_files_without_a_chat_template_get_chatml(arch: str) -> None:
    """Qwen3.5 / Qwen3-Next checkpoints carry their template; without one, the Qwen built-in (ChatML)."""
    from app.engine.text.chat_template import chat_template_for

    template = chat_template_for({}, None, arch)
    assert template.source == "builtin:chatml"
    prompt = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def _meta(lengths: list[int], slots: list[int], initial: list[bool]) -> AttentionMetadata:
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(qsl[-1])
    return AttentionMetadata(
        qsl, np.array(lengths, np.int32), np.zeros((len(lengths), 1), np.int32), np.zeros(n, np.int32),
        np.zeros(n, np.int32), max(lengths), max(lengths), 16, host_query_start_loc=qsl,
        host_state_slots=np.array(slots), host_has_initial_state=np.array(initial),
    )  # fmt: skip


def test_one_token_sequences_step_together_as_each_alone() -> None:
    """Decoding sequences take one batched step; a sequence that starts here ignores its slot's leftovers."""
    rng = np.random.default_rng(3)
    lengths, slots, initial = [1, 1, 5, 1, 12], [4, 0, 2, 1, 3], [True, False, True, True, False]
    t, hk, hv, d = sum(lengths), 2, 4, 8
    q, k = (rng.normal(size=(t, hk, d)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(t, hv, d)).astype(np.float32)
    g = -rng.uniform(0, 1, (t, hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (t, hv)).astype(np.float32)
    start_state = rng.normal(0, 10, (5, hv, d, d)).astype(np.float32)
    batched_state = start_state.copy()
    batched = gated_delta_rule(np, q, k, v, g, beta, batched_state, _meta(lengths, slots, initial))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for i, (n, slot, init) in enumerate(zip(lengths, slots, initial, strict=True)):
        rows = slice(starts[i], starts[i] + n)
        alone_state = start_state.copy()
        if not init:  # expected: it starts from a state of zeros (then continues it)
            alone_state[slot] = 0
        alone = gated_delta_rule(
            np, q[rows], k[rows], v[rows], g[rows], beta[rows], alone_state, _meta([n], [slot], [True])
        )
        np.testing.assert_allclose(batched[rows], alone, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(batched_state[slot], alone_state[slot], rtol=1e-6, atol=1e-6)


def test_stacked_hf_experts_split_in_their_own_format() -> None:
    """Qwen3.5-MoE's stacked `gate_up_proj [E, 2 ff, hidden]` splits into gate and up halves, still bf16."""
    checkpoint = open_checkpoint(FIXTURES / "qwen35moe" / "hf")
    stacked = checkpoint.tensors["blk.0.ffn_gate_up_exps.weight"]
    adapted = family("qwen35moe").adapt_hf_tensors(checkpoint.tensors, model_config(checkpoint))
    gate, up = adapted["blk.0.ffn_gate_exps.weight"], adapted["blk.0.ffn_up_exps.weight"]
    assert stacked.qtype.name == gate.qtype.name == up.qtype.name == "BF16"
    values, ff = stacked.dequantize(), stacked.shape[1] // 2
    np.testing.assert_array_equal(gate.dequantize(), values[:, :ff])
    np.testing.assert_array_equal(up.dequantize(), values[:, ff:])


def test_causal_conv_of_a_mixed_batch() -> None:
    """The conv over chunks and one-token decodes of several sequences (the decodes in one batched
    step) against the convolution written out per sequence; slots of starting sequences are ignored."""
    from app.engine.backend.recurrent_reference import causal_conv1d

    rng = np.random.default_rng(5)
    lengths, slots, initial = [1, 3, 1, 1, 2], [2, 0, 4, 1, 3], [True, True, False, True, False]
    c, kernel = 6, 4
    x = rng.normal(size=(sum(lengths), c)).astype(np.float32)
    w = rng.normal(size=(c, kernel)).astype(np.float32)
    bias = rng.normal(size=c).astype(np.float32)
    before = rng.normal(0, 10, (5, c, kernel - 1)).astype(np.float32)
    state = before.copy()
    out = causal_conv1d(np, x, w, bias, state, _meta(lengths, slots, initial), silu=False)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for i, (n, slot, init) in enumerate(zip(lengths, slots, initial, strict=True)):
        past = before[slot].T if init else np.zeros((kernel - 1, c), np.float32)
        xs = np.concatenate([past, x[starts[i] : starts[i] + n]])
        expected = np.stack([(xs[t : t + kernel] * w.T).sum(0) + bias for t in range(n)])
        np.testing.assert_allclose(out[starts[i] : starts[i] + n], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(state[slot], xs[-(kernel - 1) :].T)


def test_beta_alpha_stack_keeps_the_files_rows() -> None:
    """The layer multiplies x by beta and alpha as one matrix: the file's bytes where both share a format
    (F32 in Qwen3.5 GGUFs), their float32 values where they do not."""
    from app.engine.layers.linear import stack_rows
    from app.engine.quant.dispatch import QuantizedTensor
    from app.engine.quant.reference import quantize_q8_0
    from app.engine.quant.types import QUANT_TYPES

    rng = np.random.default_rng(3)
    beta, alpha = (rng.normal(size=(4, 64)).astype(np.float32) for _ in range(2))
    f32 = QUANT_TYPES["F32"]
    both = stack_rows(QuantizedTensor.from_float("b", beta, f32), QuantizedTensor.from_float("a", alpha, f32), "ba")
    assert both.qtype.name == "F32" and both.shape == (8, 64) and both.name == "ba"
    np.testing.assert_array_equal(both.dequantize(), np.concatenate([beta, alpha]))
    q8 = QuantizedTensor("b", QUANT_TYPES["Q8_0"], (4, 64), quantize_q8_0(beta))
    mixed = stack_rows(q8, QuantizedTensor.from_float("a", alpha, f32), "ba")
    assert mixed.qtype.name == "F32"
    np.testing.assert_array_equal(mixed.dequantize(), np.concatenate([q8.dequantize(), alpha]))


@pytest.mark.parametrize("fam", ["qwen3next", "qwen35moe"])
@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_router_and_shared_gate_as_one_product(fam: str, source: str, tmp_root: str) -> None:
    """On a backend that joins the shared expert to the routed sum (CUDA), the router's rows and the shared gate's
    row load as one matrix (layers/moe.py RouterAndGate): GGUF's 1-D gate and Hugging Face's [1, hidden] one alike.
    Its two views give the separate router's logits and gate logits."""
    from app.engine.backend.cpu import CpuBackend
    from app.engine.layers.moe import RouterAndGate

    class JoiningBackend(CpuBackend):
        moe_joins_shared = True

    path = FIXTURES / fam / "hf" if source == "hf" else gguf_path(fam, tmp_root)
    plain = build_model(open_checkpoint(path), CpuBackend(), MAX_POSITIONS)
    joined = build_model(open_checkpoint(path), JoiningBackend(), MAX_POSITIONS)
    x = np.random.default_rng(3).standard_normal((3, plain.config.hidden_size)).astype(np.float32)
    pairs = [(a.moe, b.moe) for a, b in zip(plain.layers, joined.layers, strict=True) if a.moe is not None]
    assert pairs
    for separate, one in pairs:
        assert isinstance(one.router, RouterAndGate) and one.shared is not None and separate.shared is not None
        logits, gate = one.router.with_gate(x)
        np.testing.assert_allclose(logits, separate.router(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(gate, separate.shared.gate(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(one(x), separate(x), rtol=1e-5, atol=1e-6)  # the layer: the same sum
