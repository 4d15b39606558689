"""Mamba-2 hybrids (Nemotron-H, its MoE and latent-MoE variants, Granite 4 hybrid with and without
experts) on CUDA against the numpy backend.

The models are the tiny random-weight fixtures of tests/fixtures/hybrid written as GGUFs in llama.cpp's
layout (hybrid_gguf.py), their attention heads widened to 64 (the CUDA attention kernels' smallest
head size) and the MoE ones redrawn with experts wide enough for moe.cu (WIDER), so that no layer of
any family reads back to the host and decode runs in CUDA graphs.

- Through the engine, prefill in 32-token steps (the 72-token prompt spans three): greedy tokens equal
  numpy's (but where numpy's top two log-probs are a near-tie), first-step top-5 log-probs within 5e-2
  (test_cuda_engine's bound), with decode graphs on and off, and graphs on against off.
- A batch of eight prompts of different lengths gives each the tokens it gets alone.
- The Gated DeltaNet hybrids (test_cuda_hybrid_qwen.py's fixtures): graphs on against off.
- The ops alone: backend.causal_conv1d, ssd_scan, gated_group_rms_norm on a varlen batch (prefill chunks
  from zeros and from a state row, decodes) and on a decode batch, against the numpy backend's.
- Nemotron-H's experts (sigmoid group-limited routing with its choice bias, squared-ReLU experts without
  a gate, the latent space) on moe.cu through the MoE layer, against the numpy layer, on inputs
  routed clear of ties; and in a captured decode graph, replayed on new inputs.
- NoPE's identity RoPE table goes to the device as one row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees, rel_err

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "hybrid"
FAMILIES = {  # fixture -> GGUF architecture
    "nemotron_h": "nemotron_h",
    "granite_hybrid_dense": "granitehybrid",
    "nemotron_h_moe": "nemotron_h_moe",
    "nemotron_h_latent": "nemotron_h_moe",
    "granite_hybrid": "granitehybrid",
}
HEAD_DIM = 64
# The MoE fixtures' experts are 48 (hidden) or 16 and 24 wide, not the whole 32-weight units moe.cu reads:
# those fixtures are redrawn wider (WIDER: the hidden size, and per family the experts' widths, in the
# tensors named by the key) so that their experts run on the device too.
HIDDEN = 64
WIDER = {
    "nemotron_h_moe": ({".experts.": {24: 32}}, {"moe_intermediate_size": 32}),
    "nemotron_h_latent": ({".experts.": {16: 32}, "latent_proj": {16: 32}},
                          {"moe_intermediate_size": 32, "moe_latent_size": 32}),
    "granite_hybrid": ({"block_sparse_moe.input_linear": {32: 64}, "block_sparse_moe.output_linear": {16: 32}},
                       {"intermediate_size": 32}),
}  # fmt: skip
LOGPROB_TOL = 5e-2  # test_cuda_engine.py's first-step bound


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-mamba-gguf")


def _gguf(fam: str, folder: Path) -> str:
    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from hybrid_gguf import write_mamba_gguf

    path = folder / f"{fam}.gguf"
    if not path.exists():
        source = _wider_folder(fam, folder) if fam in WIDER else FIXTURES / fam / "hf"
        write_mamba_gguf(source, FAMILIES[fam], path, attention_head_dim=HEAD_DIM)
    return str(path)


def _wider_folder(fam: str, folder: Path) -> Path:
    """The fixture with hidden size HIDDEN and its experts as WIDER says: every tensor whose shape
    changes redrawn with its old values' mean and spread, the rest kept."""
    from hybrid_gguf import hf_weights
    from safetensors.numpy import save_file

    config, weights = hf_weights(FIXTURES / fam / "hf")
    axes, fields = WIDER[fam]
    rng = np.random.default_rng(len(fam))
    tensors = {}
    for name, values in sorted(weights.items()):
        sizes = {config["hidden_size"]: HIDDEN}
        for part, widths in axes.items():
            sizes.update(widths if part in name else {})
        shape = tuple(sizes.get(n, n) for n in values.shape)
        keep = shape == values.shape
        tensors[name] = values if keep else rng.normal(values.mean(), values.std() + 1e-3, shape).astype(np.float32)
    hf = folder / f"{fam}-wider"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps({**config, "hidden_size": HIDDEN, **fields}), encoding="utf-8")
    save_file(tensors, str(hf / "model.safetensors"))
    return hf


def _tokens(fam: str) -> list[int]:
    return json.loads((FIXTURES / fam / "manifest.json").read_text())["tokens"]


def _engine(path: str, device: str, graphs: bool = False) -> Any:
    from app.engine import EngineConfig
    from app.engine.core.engine import LLMEngine

    settings: dict[str, Any] = dict(model=path, device=device, max_model_len=256, max_num_seqs=8,
                                    max_num_batched_tokens=32, enable_prefix_caching=False)  # fmt: skip
    if device == "cpu":
        settings.update(cpu_kernels="numpy", kv_cache_bytes=8 << 20)
    else:
        settings.update(cuda_graphs=graphs)
    return LLMEngine(EngineConfig(**settings))


def _params(n: int) -> Any:
    from app.engine import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("fam", FAMILIES)
def test_greedy_and_top5_match_numpy_with_graphs_on_and_off(fam: str, gguf_dir: Path, cuda) -> None:
    path, prompt = _gguf(fam, gguf_dir), _tokens(fam)
    (reference,) = _engine(path, "cpu").generate([prompt], _params(12))
    runs = {}
    for graphs in (True, False):
        engine = _engine(path, "cuda", graphs)
        assert engine.plan.graphs is graphs, f"{fam}: graphs={graphs}"
        (runs[graphs],) = engine.generate([prompt], _params(12))
        del engine
    for graphs, got in runs.items():
        for token, value in reference["logprobs"][0].top:
            assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < LOGPROB_TOL, f"graphs={graphs}"
        assert_greedy_agrees(got, reference, f"{fam} graphs={graphs}")
    assert_greedy_agrees(runs[True], runs[False], f"{fam}: graphs on against off")


@pytest.mark.parametrize("fam", ["nemotron_h", "granite_hybrid_dense", "nemotron_h_moe", "granite_hybrid"])
def test_batch_of_eight_matches_each_alone(fam: str, gguf_dir: Path, cuda) -> None:
    """Eight sequences of different lengths (prefill chunks beside decodes, then decode batches that
    shrink as they finish: graph buckets 8, 4, 2, 1 where graphs run) give each its tokens alone."""
    tokens = _tokens(fam)
    prompts = [tokens[i : i + n] for i, n in enumerate((7, 70, 20, 33, 12, 58, 41, 26))]
    engine = _engine(_gguf(fam, gguf_dir), "cuda", graphs=True)
    alone = [engine.generate([p], _params(6))[0] for p in prompts]
    together = engine.generate(prompts, _params(6))
    for i, (got, ref) in enumerate(zip(together, alone, strict=True)):
        assert len(got["token_ids"]) == 6
        assert_greedy_agrees(got, ref, f"{fam}: prompt {i} in the batch against alone")


@pytest.mark.parametrize("fam", ["qwen35", "qwen35moe", "qwen3next"])
def test_gated_deltanet_hybrids_decode_in_graphs_as_eagerly(fam: str, gguf_dir: Path, cuda) -> None:
    """The Gated DeltaNet hybrids (test_cuda_hybrid_qwen.py's widened fixtures, whose tests run eagerly)
    hold decode graphs too: eight prompts of different lengths get the same tokens with graphs on as off."""
    from test_cuda_hybrid_qwen import PROMPT, wider_gguf

    path = wider_gguf(fam, str(gguf_dir))
    prompts = [PROMPT] + [PROMPT[i : i + n] for i, n in enumerate((7, 70, 20, 33, 12, 58, 41))]
    runs = {}
    for graphs in (True, False):
        engine = _engine(path, "cuda", graphs)
        assert engine.plan.graphs is graphs, f"{fam}: graphs={graphs}"
        runs[graphs] = engine.generate(prompts, _params(10))
        del engine
    for i, (on, off) in enumerate(zip(runs[True], runs[False], strict=True)):
        assert len(on["token_ids"]) == 10
        assert_greedy_agrees(on, off, f"{fam} prompt {i}: graphs on against off")


def _meta(backend: Any, lengths: list[int], slots: list[int], initial: list[bool]) -> Any:
    from app.engine.backend.base import AttentionMetadata

    qsl = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=qsl[1:])
    n = int(qsl[-1])
    slots_a, initial_a = np.array(slots, np.int32), np.array(initial)
    seq_lens = np.array(lengths, np.int32)
    return AttentionMetadata(
        backend.from_host(qsl), backend.from_host(seq_lens), backend.from_host(np.zeros((len(lengths), 1), np.int32)),
        backend.from_host(np.zeros(n, np.int32)), backend.from_host(np.zeros(n, np.int32)), max(lengths),
        max(lengths), 16, host_query_start_loc=qsl, host_seq_lens=seq_lens, state_slots=backend.from_host(slots_a),
        has_initial_state=backend.from_host(initial_a), host_state_slots=slots_a, host_has_initial_state=initial_a,
    )  # fmt: skip


@pytest.mark.parametrize(("lengths", "slots", "initial"), [
    ([19, 1, 40, 1], [2, 0, 5, 3], [True, False, False, True]),  # prefill chunks and decodes together
    ([1] * 6, [4, 0, 3, 1, 2, 5], [True, False, True, True, False, True]),  # a decode batch
])  # fmt: skip
def test_mamba2_ops_match_numpy(lengths, slots, initial, cuda, cpu, rng) -> None:
    """One Mamba-2 mixer's device ops on the layer's own layouts (x, B, C and dt, z column ranges of
    wider rows), Nemotron-H-sized heads: 8 heads of 64, 2 groups, d_state 128, conv of 4 taps."""
    heads, head_dim, groups, d_state, k = 8, 64, 2, 128, 4
    inner, gn = heads * head_dim, groups * d_state
    conv_dim, n_tok, n_slots = inner + 2 * gn, sum(lengths), 7
    projected = rng.standard_normal((n_tok, inner + conv_dim + heads)).astype(np.float32)
    weight = (0.5 * rng.standard_normal((conv_dim, k))).astype(np.float32)
    bias = rng.standard_normal(conv_dim).astype(np.float32)
    dt_bias = rng.normal(0, 0.5, heads).astype(np.float32)
    a = -np.exp(rng.uniform(-1, 1, heads)).astype(np.float32)
    d = rng.standard_normal(heads).astype(np.float32)
    norm = rng.standard_normal(inner).astype(np.float32)
    conv0 = rng.standard_normal((n_slots, conv_dim, k - 1)).astype(np.float32)
    ssm0 = rng.normal(0, 2, (n_slots, heads, head_dim, d_state)).astype(np.float32)

    def mixer(b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        meta, proj = _meta(b, lengths, slots, initial), b.from_host(projected)
        conv_state, ssm_state = b.from_host(conv0.copy()), b.from_host(ssm0.copy())
        z, xbc, dt = proj[:, :inner], proj[:, inner : inner + conv_dim], proj[:, inner + conv_dim :]
        xbc = b.causal_conv1d(xbc, b.from_host(weight), b.from_host(bias), conv_state, meta, silu=True)
        x = xbc[:, :inner].reshape(n_tok, heads, head_dim)
        bb = xbc[:, inner : inner + gn].reshape(n_tok, groups, d_state)
        cc = xbc[:, inner + gn :].reshape(n_tok, groups, d_state)
        params = (b.from_host(v) for v in (dt_bias, a))
        y = b.ssd_scan(x, dt, *params, bb, cc, b.from_host(d), ssm_state, meta, 16)
        out = b.gated_group_rms_norm(y.reshape(n_tok, inner), z, b.from_host(norm), 1e-5, groups)
        return b.to_host(out), b.to_host(conv_state), b.to_host(ssm_state)

    got, want = mixer(cuda), mixer(cpu)
    assert rel_err(got[0], want[0]) < 1e-4
    for name, g, w in (("conv", got[1], want[1]), ("ssm", got[2], want[2])):
        for slot in range(n_slots):
            assert rel_err(g[slot], w[slot]) < 1e-4, f"{name} state row {slot}"


def _f32_tensor(name: str, values: np.ndarray) -> Any:
    from app.engine.quant.dispatch import QuantizedTensor
    from app.engine.quant.types import QUANT_TYPES

    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


def _stacked(qtype: str, experts: int, rows: int, cols: int, rng: Any, name: str) -> Any:
    from cuda_samples import random_tensor

    from app.engine.quant.dispatch import QuantizedTensor

    flat = random_tensor(qtype, experts * rows, cols, rng, name)
    return QuantizedTensor(name, flat.qtype, (experts, rows, cols), flat.data)


def _centred_q4_k(tensor: Any, rms: float, rng: Any) -> Any:
    """`tensor` (random Q4_K blocks) made like a trained one: each sub-block's min equal to its scale and
    the super-block's dmin 7.5 times its d, so weights are d * scale * (q - 7.5), centred on zero, with
    about `rms` spread. Random blocks (cuda_samples.random_tensor) have weights of mean ~2.6 and spread ~4:
    through a squared ReLU and two such products the latent sum reaches ~1e7, past float16's 65504,
    which the latent up-projection's tensor-core product of 3+ tokens rounds its input to (inf, then NaN)."""
    from app.engine.quant.dispatch import QuantizedTensor

    blocks = tensor.data.reshape(-1, 144).copy()
    blocks[:, 8:12] = blocks[:, 4:8]  # mins 0-3 and the high bits of mins 4-7: the scales'
    blocks[:, 12:16] = (blocks[:, 12:16] & 0x0F) * 0x11  # mins 4-7's low nibbles: the scales'
    d = (rms / 168.0 * rng.uniform(0.8, 1.2, len(blocks))).astype(np.float16)  # 168: rms of scale * (q - 7.5)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = (d.astype(np.float32) * 7.5).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return QuantizedTensor(tensor.name, tensor.qtype, tensor.shape, blocks.reshape(tensor.data.shape))


def _nemotron_moe(
    rng: Any, qtype: str, groups: int, latent: int | None, routing: str = "sigmoid_grouped"
) -> tuple[dict[str, Any], Any]:
    """Nemotron-H's MoE layer (3 Nano: one group; DeepSeek-style 4 groups, 2 compete; 3 Super: latent experts)
    at hidden 512: its tensors and spec (`routing` softmax_topk: the router of Qwen's and Granite's experts)."""
    from app.engine.models.config import MoeSpec

    hidden, ff, experts, used = 512, 256, 16, 4
    width = latent or hidden
    spec = MoeSpec(experts, used, ff, routing=routing, normalize=True, num_groups=groups,
                   topk_groups=min(2, groups), routed_scale=2.5, activation="relu2", latent_size=latent)  # fmt: skip
    up, down = _stacked(qtype, experts, ff, width, rng, "up"), _stacked(qtype, experts, width, ff, rng, "down")
    if qtype == "Q4_K":
        up, down = _centred_q4_k(up, 0.05, rng), _centred_q4_k(down, 0.05, rng)
    p = "blk.1"
    tensors = {
        f"{p}.ffn_gate_inp.weight": _f32_tensor("router", rng.standard_normal((experts, hidden)) / 16),
        f"{p}.exp_probs_b.bias": _f32_tensor("bias", rng.standard_normal(experts) * 0.1),
        f"{p}.ffn_up_exps.weight": up,
        f"{p}.ffn_down_exps.weight": down,
    }
    if latent:
        tensors[f"{p}.ffn_latent_down.weight"] = _f32_tensor("ld", rng.standard_normal((latent, hidden)) / 16)
        tensors[f"{p}.ffn_latent_up.weight"] = _f32_tensor("lu", rng.standard_normal((hidden, latent)) / 16)
    return tensors, spec


ROUTE_MARGIN = 1e-3  # the inputs' choice values clear the k-th best by this: ~8x the router's float16 error


def _route_margin(x: np.ndarray, tensors: dict[str, Any], spec: Any) -> np.ndarray:
    """Per token, how far the router's choices (sigmoid_grouped: the best groups, then the k best experts) are
    from a tie: the smallest gap between a chosen and the best unchosen group sum, and expert choice value
    (softmax_topk: logit)."""
    logits = x.astype(np.float64) @ tensors["blk.1.ffn_gate_inp.weight"].dequantize().astype(np.float64).T
    choice = logits
    if spec.routing == "sigmoid_grouped":
        choice = 1.0 / (1.0 + np.exp(-logits)) + tensors["blk.1.exp_probs_b.bias"].dequantize().reshape(-1)
    margins = []
    if spec.num_groups > 1:
        grouped = choice.reshape(len(x), spec.num_groups, -1)
        best_two = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
        sums = np.sort(best_two, axis=-1)[:, ::-1]
        margins.append(sums[:, spec.topk_groups - 1] - sums[:, spec.topk_groups])
        kept = np.argsort(-best_two, axis=-1, kind="stable")[:, : spec.topk_groups]
        allowed = np.zeros(grouped.shape[:2], bool)
        np.put_along_axis(allowed, kept, True, axis=-1)
        choice = np.where(np.repeat(allowed, grouped.shape[2], axis=1), choice, -np.inf)
    ranked = -np.sort(-choice, axis=-1)
    margins.append(ranked[:, spec.num_used - 1] - ranked[:, spec.num_used])
    return np.minimum.reduce(margins)


def _clear_inputs(rng: Any, n_tok: int, tensors: dict[str, Any], spec: Any) -> np.ndarray:
    """`n_tok` random hidden states whose routing is ROUTE_MARGIN from any tie, so that the device's router
    (a float16 product from 3 tokens, linear.py) picks the numpy layer's experts."""
    x = rng.standard_normal((4 * n_tok + 8, 512)).astype(np.float32)
    x = x[_route_margin(x, tensors, spec) > ROUTE_MARGIN][:n_tok]
    assert len(x) == n_tok and _route_margin(x, tensors, spec).min() > ROUTE_MARGIN
    return x


@pytest.mark.parametrize("n_tok", [1, 5, 70])
@pytest.mark.parametrize(("qtype", "groups", "latent"), [("Q8_0", 1, None), ("BF16", 4, None), ("Q4_K", 1, 256)])
def test_nemotron_experts_run_on_the_device(cuda, cpu, rng, n_tok: int, qtype: str, groups: int, latent) -> None:
    """The MoE layer of Nemotron-H takes moe.cu on CUDA, with no host sync, and equals the numpy layer. Float32
    throughout but for the latent projections of 3+ tokens (float32 weights with a float16 copy: cuBLAS on
    float16 x, hence F16_TOL) and the experts of a prefill-sized batch (moe_mma.py: float16 tensor cores);
    the Q4_K latent experts are centred as trained ones are, their outputs O(1)."""
    from cuda_samples import F16_TOL, backend_int_x, experts_tol

    from app.engine.backend.cuda.linear import DENSE_FROM_TOKENS
    from app.engine.layers.moe import MoE

    tensors, spec = _nemotron_moe(rng, qtype, groups, latent)
    on_gpu, reference = MoE(cuda, tensors, "blk.1", spec), MoE(cpu, tensors, "blk.1", spec)
    assert not on_gpu.syncs_host and reference.syncs_host
    x = _clear_inputs(rng, n_tok, tensors, spec)
    got, want = cuda.to_host(on_gpu(cuda.from_host(x))), reference(x)
    assert np.isfinite(got).all()
    if latent:  # the centred experts' outputs are O(1), as a trained model's: far from float16's range
        assert 0.1 < np.sqrt(np.mean(want**2)) < 100
    experts = experts_tol(n_tok, spec.num_used, spec.num_experts, qtype, latent or 512, backend_int_x())  # 70: mma
    assert rel_err(got, want) < max(F16_TOL if latent and n_tok >= DENSE_FROM_TOKENS else 1e-4, experts)


@pytest.mark.parametrize("routing", ["sigmoid_grouped", "softmax_topk"])
def test_moe_in_a_decode_graph_reads_this_replays_router_logits(cuda, rng, routing: str) -> None:
    """A router product then moe.cu, captured as decode graphs capture (programmatic launches, sm_90+), replayed
    on new inputs: each replay gives the eager layer's output. Before moe.cu's kernels waited for their
    predecessor (issue 34), moe_route started while the router's GEMV still ran and routed on the previous
    replay's logits: other experts than eagerly, the split at the first graph decode step of nemotron_h_moe."""
    from app.engine.layers.moe import MoE
    from app.engine.worker.decode_graphs import capture_buckets

    tensors, spec = _nemotron_moe(rng, "Q8_0", 1, None, routing)
    layer = MoE(cuda, tensors, "blk.1", spec)
    static = cuda.from_host(np.zeros((1, 512), np.float32))
    cuda.xp.cuda.Device().synchronize()  # the side stream does not wait for the weights' uploads (decode_graphs.py)
    stream = cuda.xp.cuda.Stream(non_blocking=True)
    graphs = capture_buckets([1], lambda n: layer(static), stream, stage=lambda n: static.fill(0.5))
    graph, output = graphs[1]
    for step, x in enumerate(_clear_inputs(rng, 12, tensors, spec)):
        eager = cuda.to_host(layer(cuda.from_host(x[None])))
        static.set(x[None])
        graph.launch()
        assert rel_err(cuda.to_host(output), eager) < 1e-5, f"replay {step}"


def test_a_nope_table_goes_to_the_device_as_one_row(cuda) -> None:
    """Nemotron-H's attention has no positions and its GGUF a 2^20-token context: the identity table is
    one broadcast row on the host, and one row on the device (the kernels clamp positions to it)."""
    from app.engine.layers.rope import identity_table

    table = cuda.rope_table(*identity_table(64, 1 << 20))
    assert table.cos.shape == table.sin.shape == (1, 64)
    assert float(table.cos.min()) == 1.0 and float(abs(table.sin).max()) == 0.0
