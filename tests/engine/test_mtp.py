"""The multi-token-prediction head (models/mtp.py) and its drafter (core/mtp_drafter.py, `--speculative mtp`).

The tiny Qwen3.5 / Qwen3-Next fixtures get a random MTP head (`write_hf_with_mtp`: `mtp.*` in the
folder, which transformers ignores) and are converted to GGUF the llama.cpp way (the head as the block
after the last layer, `blk.N.nextn.*`). The head's forward is checked against a numpy implementation
written here from the folder's raw weights, as vLLM's Qwen3-Next MTP and transformers' Qwen3.5 layers
define it; the folder and the GGUF give the head the same tensors; through the engine, greedy tokens
with MTP drafts equal those without, and a head built to repeat its input token gets drafts accepted.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GQ
from hybrid_gguf import (  # sibling module: tests/engine is on sys.path
    hf_weights,
    write_hf_with_mtp,
    write_mamba_gguf,
    write_qwen_gguf,
)

from app.engine import EngineConfig, SamplingParams
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import ScheduledChunk
from app.engine.loader.weights import open_checkpoint
from app.engine.models.mtp import mtp_tensors
from app.engine.models.registry import family, model_config
from app.engine.request import Request

HYBRID = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def f32(name: str, data: np.ndarray) -> GQ:
    return GQ.F32


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mtp")


def mtp_model(fam: str, folder: Path, repeat: bool = False) -> tuple[Path, Path]:
    """(HF folder with an MTP head, its float32 GGUF); `repeat`: the head built to draft its input token."""
    tag = f"{fam}-repeat" if repeat else fam
    hf = folder / f"{tag}-hf"
    if not hf.exists():
        write_hf_with_mtp(HYBRID / fam / "hf", hf)
        if repeat:
            make_repeat_head(hf)
    path = folder / f"{tag}.gguf"
    if not path.exists():
        write_qwen_gguf(hf, fam, path, float_type=f32)
    return hf, path


def make_repeat_head(hf: Path) -> None:
    """The head's fc keeps the embedding half only and its block adds nothing (o_proj and down_proj
    zero): its output is the normalised embedding of its input token t, whose logits (tied embeddings)
    peak at t (a model with tied embeddings: Qwen3.5's tiny one). Drafts then repeat the last token,
    which random tiny models often do too."""
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    _, weights = hf_weights(hf)
    hidden = weights["mtp.fc.weight"].shape[0]
    weights["mtp.fc.weight"] = np.concatenate([np.eye(hidden), np.zeros((hidden, hidden))], axis=1).astype(np.float32)
    weights["mtp.layers.0.self_attn.o_proj.weight"][:] = 0
    weights["mtp.layers.0.mlp.down_proj.weight"][:] = 0
    write_safetensors(hf / "model.safetensors", {n: StoredTensor("F32", tuple(v.shape), v) for n, v in weights.items()})


def engine(path: Path, **fields: Any) -> LLMEngine:
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_num_seqs=4,
                                    max_num_batched_tokens=64, block_size=8, kv_cache_bytes=64 << 20,
                                    speculative="mtp", num_draft_tokens=3, speculative_max_batch=8)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


# -- the reference: the MTP head in numpy from the folder's weights -------------------------------


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3.5's zero-centred RMS norm: x / rms(x) * (1 + w)."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w)


def rope(x: np.ndarray, positions: np.ndarray, rotary: int, theta: float) -> np.ndarray:
    """Rotate-half RoPE on the first `rotary` dims of each head `[T, heads, d]`."""
    inv = theta ** (-np.arange(0, rotary, 2) / rotary)
    angles = positions[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1))[:, None], np.sin(np.concatenate([angles, angles], -1))[:, None]
    rot, rest = x[..., :rotary], x[..., rotary:]
    half = rotary // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], -1)
    return np.concatenate([rot * cos + rotated * sin, rest], -1)


def reference_mtp(cfg: dict[str, Any], w: dict[str, np.ndarray], tokens: list[int], hidden: np.ndarray) -> np.ndarray:
    """Normed outputs `[T, hidden]` of the MTP head over tokens at positions 0..T-1, each with the
    hidden state of the position before its token (vLLM's Qwen3NextMultiTokenPredictor.forward)."""
    eps, heads, kv, d = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = "mtp.layers.0."
    n = len(tokens)
    embedded = rms(w["model.embed_tokens.weight"][tokens], w["mtp.pre_fc_norm_embedding.weight"], eps)
    x = np.concatenate([embedded, rms(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)], -1) @ w["mtp.fc.weight"].T
    h = rms(x, w[p + "input_layernorm.weight"], eps)
    q_gate = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, 2 * d)
    q, gate = q_gate[..., :d], q_gate[..., d:].reshape(n, heads * d)
    q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
    k = rms((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv, d), w[p + "self_attn.k_norm.weight"], eps)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv, d)
    positions = np.arange(n, dtype=np.float64)
    rotary = int(d * cfg["rope_parameters"]["partial_rotary_factor"])
    theta = cfg["rope_parameters"]["rope_theta"]
    q, k = rope(q, positions, rotary, theta), rope(k, positions, rotary, theta)
    k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((n, n), bool))[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attended = np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * d) / (1 + np.exp(-gate))
    x = x + attended @ w[p + "self_attn.o_proj.weight"].T
    h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
    x = x + (reference_moe(cfg, w, p + "mlp.", h) if cfg.get("num_experts") else mlp(w, p + "mlp.", h))
    return rms(x, w["mtp.norm.weight"], eps)


def mlp(w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    gate = h @ w[p + "gate_proj.weight"].T
    return ((gate / (1 + np.exp(-gate))) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def expert_weights(w: dict[str, np.ndarray], p: str, e: int) -> dict[str, np.ndarray]:
    """Expert e's projections, from per-expert tensors (Qwen3-Next) or stacked ones (Qwen3.5-MoE:
    `gate_up_proj` [E, 2 ff, hidden], gate rows first, and `down_proj` [E, hidden, ff])."""
    if f"{p}experts.gate_up_proj" not in w:
        return {part: w[f"{p}experts.{e}.{part}"] for part in ("gate_proj.weight", "up_proj.weight", "down_proj.weight")}
    gate_up = w[f"{p}experts.gate_up_proj"][e]
    ff = gate_up.shape[0] // 2
    return {"gate_proj.weight": gate_up[:ff], "up_proj.weight": gate_up[ff:], "down_proj.weight": w[f"{p}experts.down_proj"][e]}


def reference_moe(cfg: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """Qwen3-Next's sparse block: softmax router, top-k renormalised, plus the shared expert gated by a sigmoid."""
    scores = h @ w[p + "gate.weight"].T
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-probs[t])[: cfg["num_experts_per_tok"]]
        weights = probs[t, top] / probs[t, top].sum()
        for e, weight in zip(top, weights, strict=True):
            out[t] += weight * mlp(expert_weights(w, p, int(e)), "", h[t : t + 1])[0]
    shared_gate = 1 / (1 + np.exp(-(h @ w[p + "shared_expert_gate.weight"].T)))
    return out + mlp(w, p + "shared_expert.", h) * shared_gate


def reference_logits(w: dict[str, np.ndarray], normed: np.ndarray) -> np.ndarray:
    return normed @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T  # the model's head (or tied embeddings)


def fake_request(eng: LLMEngine, tokens: list[int]) -> Request:
    """A request owning blocks 1.. of an idle engine (for running the head alone)."""
    request = Request("probe", tokens, GREEDY)
    request.block_ids = list(range(1, -(-(len(tokens) + 8) // eng.block_size) + 1))
    request.state_slot = 1  # the runner's metadata names one; the head has no recurrent layer
    return request


@pytest.mark.parametrize("fam", ["qwen35", "qwen3next", "qwen35moe"])
def test_mtp_head_matches_a_numpy_implementation_over_a_chunk_and_chained(fam: str, mtp_dir: Path) -> None:
    hf, path = mtp_model(fam, mtp_dir)
    config, w = hf_weights(hf)
    cfg = config.get("text_config", config)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    eng = engine(path)
    drafter, backend = eng.mtp, eng.backend
    assert drafter is not None
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(0, cfg["vocab_size"], 9)]
    hidden = rng.normal(0, 1, (9, cfg["hidden_size"])).astype(np.float32)
    expected = reference_mtp(cfg, w, tokens, hidden.astype(np.float64))
    request = fake_request(eng, tokens)
    got = backend.to_host(drafter._run(request, 0, tokens, backend.from_host(hidden)))
    assert np.abs(got - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
    logits = backend.to_host(drafter.head.logits(backend.from_host(got.astype(np.float32))))
    assert np.abs(logits - reference_logits(w, expected)).max() < 2e-3 * np.abs(logits).max()
    # the last position again, alone: it reads the K/V the chunk wrote at positions 0..7
    last = backend.to_host(drafter._run(request, 8, tokens[8:], backend.from_host(hidden[8:])))
    assert np.abs(last[0] - expected[8]).max() < 1e-3 * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize("max_rows", [64, 4], ids=["one_piece", "in_pieces"])
def test_mtp_drafts_chain_the_heads_own_output_greedily(max_rows: int, mtp_dir: Path) -> None:
    """propose_for: the head over the positions seen (target hidden states; in pieces of `max_rows`), its
    argmax; then each next draft from the head's own output at the next position, with the draft before
    as its token."""
    hf, path = mtp_model("qwen35", mtp_dir)
    config, w = hf_weights(hf)
    cfg = config.get("text_config", config)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    eng = engine(path)
    drafter = eng.mtp
    assert drafter is not None
    drafter.max_rows = max_rows
    rng = np.random.default_rng(4)
    tokens = [int(t) for t in rng.integers(0, cfg["vocab_size"], 7)]
    hidden = rng.normal(0, 1, (6, cfg["hidden_size"])).astype(np.float32)
    request = fake_request(eng, tokens)
    request.num_computed_tokens = 6  # positions 0..5 computed; token 6 is the last sampled
    drafter._seen[request.request_id] = (0, eng.backend.from_host(hidden))
    drafts = drafter.propose_for(request, 3)
    seq, rows, expected = list(tokens[1:]), hidden.astype(np.float64), []
    for _ in range(3):
        out = reference_mtp(cfg, w, seq, rows)
        expected.append(int(np.argmax(reference_logits(w, out[-1:])[0])))
        seq, rows = [*seq, expected[-1]], np.concatenate([rows, out[-1:]])
    assert drafts == expected
    assert drafter._seen[request.request_id][0] == 6  # caught up to the computed positions


@pytest.mark.parametrize("fam", ["qwen35", "qwen35moe"])
def test_folder_and_gguf_give_the_head_the_same_tensors(fam: str, mtp_dir: Path) -> None:
    hf, path = mtp_model(fam, mtp_dir)
    heads = []
    for source in (hf, path):
        checkpoint = open_checkpoint(source)
        cfg = model_config(checkpoint)
        tensors = mtp_tensors(checkpoint, cfg, family(checkpoint.architecture))
        assert tensors is not None
        heads.append({name: t.dequantize().astype(np.float32) for name, t in tensors.items()})
    folder, gguf_file = heads
    assert sorted(folder) == sorted(gguf_file) and any(".nextn.enorm" in n for n in folder)
    for name, values in folder.items():
        np.testing.assert_allclose(values.reshape(gguf_file[name].shape), gguf_file[name], rtol=1e-6, atol=1e-6,
                                   err_msg=name)  # fmt: skip


# -- through the engine -------------------------------------------------------------------------


def prompts(vocab: int = 150) -> list[list[int]]:
    return [[int(t) for t in np.random.default_rng(seed).integers(3, vocab, 20)] for seed in range(3)]


def without_drafts(eng: LLMEngine, batch: list[list[int]]) -> list[list[int]]:
    speculator, eng.speculator = eng.speculator, None
    try:
        return [r["token_ids"] for r in eng.generate(batch, GREEDY)]
    finally:
        eng.speculator = speculator


@pytest.mark.parametrize(("fam", "repeat"), [("qwen35", False), ("qwen3next", False), ("qwen35", True)],
                         ids=["qwen35", "qwen3next", "qwen35_repeat_head"])  # fmt: skip
def test_greedy_tokens_with_mtp_drafts_equal_without(fam: str, repeat: bool, mtp_dir: Path) -> None:
    _, path = mtp_model(fam, mtp_dir, repeat=repeat)
    eng = engine(path)
    batch = prompts()
    expected = without_drafts(eng, batch)
    assert [r["token_ids"] for r in eng.generate(batch, GREEDY)] == expected
    speculator = eng.speculator
    assert speculator is not None and speculator.drafted > 0
    if repeat:
        repeats = sum(a == b for out in expected for a, b in itertools.pairwise(out))
        assert repeats > 0, "the model never repeats a token: the test shows nothing"
        assert speculator.accepted > 0
        stats = eng.stats()
        assert (stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total) == (
            speculator.drafted, speculator.accepted)  # fmt: skip
    eng.scheduler.check_integrity()
    assert not eng.mtp._seen, "hidden states kept for finished requests"


def test_preempted_mtp_requests_resume_with_the_same_tokens(mtp_dir: Path) -> None:
    _, path = mtp_model("qwen35", mtp_dir, repeat=True)
    batch = [p * 2 for p in prompts()] + [prompts()[0][::-1] * 2]
    expected = without_drafts(engine(path), batch)
    tight = engine(path, num_kv_blocks=14)
    assert [r["token_ids"] for r in tight.generate(batch, GREEDY)] == expected
    assert tight.scheduler.num_preemptions > 0 and tight.speculator is not None and tight.speculator.drafted > 0
    tight.scheduler.check_integrity()


def test_a_model_without_an_mtp_head_is_refused_naming_it(mtp_dir: Path) -> None:
    path = mtp_dir / "plain-qwen35.gguf"
    write_qwen_gguf(HYBRID / "qwen35" / "hf", "qwen35", path)
    with pytest.raises(ValueError, match=r"speculative mtp needs a model with a multi-token-prediction head.*plain-qwen35"):
        engine(path)
    llama = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "llama" / "llama-bf16-q8_0.gguf"
    with pytest.raises(ValueError, match="has none"):
        engine(llama)


def test_mtp_flag_reaches_the_engine_config_and_requests_report_their_drafts(mtp_dir: Path) -> None:
    """`--speculative mtp` from serve and generate; each request's output carries what the head drafted
    and what was accepted, and the engine's totals (/metrics) add them up."""
    from app.cli import build_parser
    from app.commands.common import engine_config

    for command in (["serve"], ["generate", "hello"]):
        assert engine_config(build_parser().parse_args([*command, "--speculative", "mtp"])).speculative == "mtp"
    _, path = mtp_model("qwen35", mtp_dir, repeat=True)
    eng = engine(path)
    for i, prompt in enumerate(prompts()):
        eng.add_request(f"r{i}", prompt, GREEDY)
    finals = []
    while eng.has_unfinished():
        finals += [out for out in eng.step() if out.finished]
    stats = eng.stats()
    assert sum(out.num_draft_tokens for out in finals) == stats.spec_draft_tokens_total > 0
    assert sum(out.num_accepted_tokens for out in finals) == stats.spec_accepted_tokens_total > 0


def test_the_memory_plan_counts_the_heads_kv_in_every_block(mtp_dir: Path) -> None:
    _, path = mtp_model("qwen35", mtp_dir)
    on, off = engine(path), engine(path, speculative="ngram")
    layers = len(off.model_config.attention_layers)
    assert on.shape.kv_bytes_per_token(2) * layers == off.shape.kv_bytes_per_token(2) * (layers + 1)
    first = on.runner.kv_caches[on.model_config.attention_layers[0]]
    assert on.mtp is not None
    assert [a.shape for a in on.mtp.cache] == [a.shape for a in first]  # the same blocks, one more layer's K/V


# -- Nemotron-H (MoE): the head as llama.cpp's nemotron_h_moe graph_mtp runs it -------------------


def nemotron_mtp(folder: Path) -> Path:
    path = folder / "nemotron-mtp.gguf"
    if not path.exists():
        write_mamba_gguf(HYBRID / "nemotron_h_moe" / "hf", "nemotron_h_moe", path, kind=GQ.F32, mtp_block=True)
    return path


def test_nemotron_h_head_fuses_its_inputs_and_ends_in_a_layer_norm(mtp_dir: Path) -> None:
    """The fusion (plain RMS norms of embedding and hidden state, concatenated in that order, eh_proj)
    and the closing LayerNorm in numpy from the GGUF's tensors, around the block run by the engine's
    own decoder layer (the model's NoPE attention and experts, checked by the family's tests)."""
    path = nemotron_mtp(mtp_dir)
    eng = engine(path)
    assert eng.mtp is not None
    head, backend, block = eng.mtp.head, eng.backend, eng.model_config.num_layers
    tensors = {n: t.dequantize().astype(np.float64) for n, t in open_checkpoint(path).tensors.items()
               if n.startswith(f"blk.{block}.nextn.") or n == "token_embd.weight"}  # fmt: skip
    eps = eng.model_config.rms_norm_eps

    def plain_rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    rng = np.random.default_rng(6)
    tokens = [int(t) for t in rng.integers(0, eng.model_config.vocab_size, 7)]
    hidden = rng.normal(0, 1, (7, eng.model_config.hidden_size))
    nextn = f"blk.{block}.nextn."
    fused = np.concatenate([plain_rms(tensors["token_embd.weight"][tokens], tensors[nextn + "enorm.weight"]),
                            plain_rms(hidden, tensors[nextn + "hnorm.weight"])], -1) @ tensors[nextn + "eh_proj.weight"].T  # fmt: skip
    request = fake_request(eng, tokens)
    meta, _ = eng.runner.metadata([ScheduledChunk(request, 0, len(tokens), True)])
    h, residual = head.layer(backend.from_host(fused.astype(np.float32)), None, meta, eng.mtp.cache)
    stream = backend.to_host(h + residual).astype(np.float64)
    centred = stream - stream.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + eps) * tensors[nextn + "shared_head_norm.weight"]
    got = backend.to_host(eng.mtp._run(request, 0, tokens, backend.from_host(hidden.astype(np.float32))))
    assert np.abs(got - expected).max() < 1e-3


def test_nemotron_h_greedy_tokens_with_mtp_drafts_equal_without(mtp_dir: Path) -> None:
    eng = engine(nemotron_mtp(mtp_dir))
    batch = prompts()
    expected = without_drafts(eng, batch)
    assert [r["token_ids"] for r in eng.generate(batch, GREEDY)] == expected
    assert eng.speculator is not None and eng.speculator.drafted > 0
    eng.scheduler.check_integrity()
