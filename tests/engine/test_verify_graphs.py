"""The verify graphs (worker/verify_graphs.py) without a GPU: which graph a verify step replays, the
inputs it stages (the chunks packed first, then one padding row per unused sequence and one padding
sequence with every row left, all in the null block and the null state row), and, replayed eagerly on
the numpy backend by a stand-in for CuPy's graphs, a speculative engine's greedy tokens and log-probs
equal those of decoding without drafts, on a dense family model and on hybrid ones (Gated DeltaNet,
Mamba-2) whose rejected drafts roll their recurrent state back; with the MTP head, its drafts are those
of the eager steps."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_decode_graphs_staging import _fake_cupy  # sibling module: tests/engine is on sys.path
from test_hybrid_speculative import (  # sibling module
    SCORED,
    assert_clean,
    assert_same,
    family_gguf,
    loop_prompts,
    record_verifies,
    scored,
    without_drafts,
)
from test_mtp import GREEDY, mtp_model  # sibling module
from test_mtp import engine as mtp_engine
from test_mtp import prompts as mtp_prompts
from test_mtp import without_drafts as without_mtp

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.kernels.options import KernelOptions
from app.engine.worker.mtp_graph import MtpStepGraph
from app.engine.worker.verify_graphs import VerifyGraphs, verify_shapes, verify_widths

BLOCK = 8
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"


def _stand_in_cupy() -> Any:
    xp = _fake_cupy()
    xp.float32 = np.float32
    xp.cuda.Event = lambda disable_timing=False: types.SimpleNamespace(record=lambda stream: None,
                                                                       synchronize=lambda: None)  # fmt: skip
    return xp


class _EagerGraph:
    """A captured graph's stand-in: each launch runs the forward again into the captured output."""

    def __init__(self, graphs: VerifyGraphs, shape: tuple[int, int], output: Any) -> None:
        self.graphs, self.shape, self.output = graphs, shape, output

    def launch(self, stream: Any = None) -> None:
        fresh = self.graphs._forward(self.shape)
        for kept, new in zip(*((self.output, fresh) if self.graphs.keep_hidden else ((self.output,), (fresh,))),
                             strict=True):  # fmt: skip
            kept[...] = new


def eager_verify_graphs(model: Any, kv_caches: list, max_model_len: int, max_batch: int, max_drafts: int,
                        block_size: int = BLOCK, keep_hidden: bool = False) -> VerifyGraphs:  # fmt: skip
    """Verify graphs over the numpy backend, "captured" by running each shape's forward on padding
    inputs, replayed by running it again. The forward's metadata also carries its fields as the host
    copies the numpy reference walks (on the CPU they are the same arrays)."""
    backend = types.SimpleNamespace(xp=_stand_in_cupy(), kernel_options=KernelOptions())
    graphs = VerifyGraphs(model, backend, kv_caches, block_size, max_model_len, max_batch, max_drafts, keep_hidden)
    metadata = graphs._metadata

    def with_host_copies(shape: tuple[int, int]) -> Any:
        meta = metadata(shape)
        meta.host_query_start_loc, meta.host_seq_lens = meta.query_start_loc, meta.seq_lens
        meta.host_state_slots, meta.host_has_initial_state = meta.state_slots, meta.has_initial_state
        return meta

    graphs._metadata = with_host_copies  # type: ignore[method-assign]
    for shape in reversed(graphs.shapes):  # largest first, as capture_buckets captures them
        graphs._stage(shape, [], [], np.zeros(0, np.int32), np.zeros((0, 1), np.int32), None)
        output = graphs._forward(shape)
        output = tuple(np.array(o) for o in output) if keep_hidden else np.array(output)
        graphs._graphs[shape] = (_EagerGraph(graphs, shape, output), output)
    return graphs


class _EagerStepGraph:
    """The MTP step graph's stand-in: each launch runs the head again into the captured rows."""

    def __init__(self, step: MtpStepGraph) -> None:
        self.step = step

    def launch(self, stream: Any = None) -> None:
        for kept, new in zip(self.step._out, self.step._forward(), strict=True):
            kept[...] = new


def eager_step_graph(engine: LLMEngine) -> MtpStepGraph:
    """The MTP head's draft-step graph over the numpy backend, "captured" and replayed eagerly."""
    drafter = engine.mtp
    backend = types.SimpleNamespace(xp=_stand_in_cupy(), kernel_options=KernelOptions())
    step = MtpStepGraph(drafter.head, backend, drafter.cache, engine.block_size, engine.max_model_len,
                        engine.model_config.hidden_size)  # fmt: skip
    step._stage(0, 0, [], None)
    step._out = tuple(np.array(o) for o in step._forward())
    step._graph = _EagerStepGraph(step)
    return step


# -- which graph ------------------------------------------------------------------------------


def test_widths_and_shapes_follow_the_draft_count_and_the_batch() -> None:
    assert verify_widths(8) == [3, 5, 9] and verify_widths(4) == [3, 5] and verify_widths(5) == [3, 5, 6]
    assert verify_widths(1) == [2]
    assert verify_shapes(2, 4) == [(4, 1), (6, 1), (7, 2), (11, 2)]
    assert verify_shapes(64, 2) == verify_shapes(8, 2) == [(4, 1), (7, 2), (13, 4), (25, 8)]  # at most 8 sequences
    with pytest.raises(ValueError, match="at least one draft"):
        verify_widths(0)


def test_a_step_takes_the_smallest_graph_its_rows_and_padding_fit() -> None:
    graphs = VerifyGraphs(None, types.SimpleNamespace(xp=_stand_in_cupy()), [], BLOCK, 512, 4, 8)
    assert graphs.shapes == [(4, 1), (6, 1), (7, 2), (10, 1), (11, 2), (13, 4), (19, 2), (21, 4), (37, 4)]
    assert graphs.shape_for([3]) == (4, 1)  # two drafts: 3 rows and the padding sequence's one
    assert graphs.shape_for([9]) == (10, 1)
    assert graphs.shape_for([4]) == (6, 1)  # three drafts pad up to four
    assert graphs.shape_for([9, 1]) == (11, 2)  # a decode beside a verify chunk
    assert graphs.shape_for([3, 1, 1]) == (13, 4)  # 5 rows + 1 unused sequence + the padding sequence
    assert graphs.shape_for([12]) == (19, 2)  # a hybrid rollback's kept tokens and drafts: wider than any w
    assert graphs.shape_for([9, 9, 9, 9]) == (37, 4)
    assert graphs.shape_for([9, 9, 9, 9, 1]) is None  # more sequences than the speculative batch
    assert graphs.shape_for([30, 9]) is None  # a prefill chunk beside them: eager


# -- what it stages ----------------------------------------------------------------------------


def test_a_step_stages_its_chunks_first_then_the_padding_sequences_in_the_null_block_and_row() -> None:
    model = types.SimpleNamespace(config=types.SimpleNamespace(is_hybrid=True))
    graphs = VerifyGraphs(model, types.SimpleNamespace(xp=_stand_in_cupy()), [], BLOCK, 512, 4, 4)
    launched = []
    graphs._graphs = {s: (types.SimpleNamespace(launch=lambda stream=None, s=s: launched.append(s)), s)
                      for s in graphs.shapes}  # fmt: skip
    # a verify chunk of 2 drafts after 13 computed tokens (blocks 3, 5) and a decode at position 6 (block 9)
    tables = np.array([[3, 5], [9, 0]], np.int32)
    shape = graphs.run(np.array([70, 71, 72, 80], np.int32), [3, 1], np.array([13, 6], np.int32), tables,
                       state_slots=np.array([4, 2], np.int32), has_initial_state=np.array([True, True]))  # fmt: skip
    assert shape == (7, 2) and launched == [shape] and graphs.replays == 1  # 4 rows + the padding sequence's 3
    ids, pos, slots, qsl, lens, rows, starts, table = (np.asarray(f) for f in graphs._fields(graphs._device, shape))
    assert ids.tolist() == [70, 71, 72, 80, 0, 0, 0]
    assert qsl.tolist() == [0, 3, 4, 7] and lens.tolist() == [16, 7, 3]
    assert pos.tolist() == [13, 14, 15, 6, 0, 1, 2]
    assert slots.tolist() == [5 * BLOCK + 5, 5 * BLOCK + 6, 5 * BLOCK + 7, 9 * BLOCK + 6, 0, 1, 2]
    assert table[:2, :2].tolist() == tables.tolist() and not table[:2, 2:].any() and not table[2].any()
    assert rows.tolist() == [4, 2, 0] and starts.tolist() == [1, 1, 0]

    # a rolled-back chunk longer than any width (kept tokens and drafts): a graph of two sequences, its
    # second unused (one padding row), then the padding sequence (one row)
    graphs.run(np.arange(9, dtype=np.int32), [9], np.array([40], np.int32), np.array([[1, 2, 3, 4, 6, 7, 9]], np.int32),
               state_slots=np.array([3], np.int32), has_initial_state=np.array([True]))  # fmt: skip
    shape = (11, 2)
    assert launched[-1] == shape
    _, pos, slots, qsl, lens, rows, starts, _ = (np.asarray(f) for f in graphs._fields(graphs._device, shape))
    assert qsl.tolist() == [0, 9, 10, 11] and lens.tolist() == [49, 1, 1]
    assert pos.tolist() == [*range(40, 49), 0, 0]  # positions 40-47 in the table's block 7, 48 in block 9
    assert slots[:9].tolist() == [*range(7 * BLOCK, 8 * BLOCK), 9 * BLOCK]
    assert slots[9:].tolist() == [0, 0] and rows.tolist() == [3, 0, 0] and starts.tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="state_slots"):
        graphs.run(np.arange(3, dtype=np.int32), [3], np.array([5], np.int32), np.array([[1]], np.int32))
    with pytest.raises(ValueError, match="no verify graph holds 1 chunks of 40 tokens"):
        graphs.run(np.arange(40, dtype=np.int32), [40], np.array([5], np.int32), np.array([[1]], np.int32),
                   state_slots=np.array([3], np.int32), has_initial_state=np.array([True]))  # fmt: skip


# -- replayed in an engine ----------------------------------------------------------------------


def graphed_engine(path: Path) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", cpu_kernels="numpy", max_model_len=256,
                                    max_num_seqs=4, max_num_batched_tokens=64, block_size=BLOCK,
                                    kv_cache_bytes=64 << 20, speculative="ngram", num_draft_tokens=4,
                                    speculative_max_batch=4))  # fmt: skip
    runner = engine.runner
    runner.verify_graphs = eager_verify_graphs(engine.model, runner.kv_caches, engine.max_model_len, 4, 4)
    return engine


def record_eager_steps(engine: LLMEngine, verify_only: bool = False) -> list[list[int]]:
    """The chunk sizes of every step (`verify_only`: with drafts) the runner runs eagerly from now on."""
    runner, eager = engine.runner, []
    run_eager = runner._run_eager

    def recording(chunks: list[Any]) -> Any:
        if not verify_only or any(c.draft_token_ids for c in chunks):
            eager.append([c.num_tokens for c in chunks])
        return run_eager(chunks)

    runner._run_eager = recording  # type: ignore[method-assign]
    return eager


def record_drafts(engine: LLMEngine) -> list[tuple[int, ...]]:
    """The drafts of every verify step from now on, in order."""
    speculator, drafts = engine.speculator, []
    assert speculator is not None
    verify = speculator.verify

    def recording(request: Any, proposed: Any, sampled: Any) -> list[int]:
        drafts.append(tuple(proposed))
        return verify(request, proposed, sampled)

    speculator.verify = recording  # type: ignore[method-assign]
    return drafts


@pytest.mark.parametrize("fam", ["qwen3", "qwen35", "qwen3next", "nemotron_h"])
def test_verify_steps_replayed_from_graphs_keep_greedy_tokens_and_logprobs(fam: str, tmp_path: Path) -> None:
    """Three requests whose drafts are mostly rejected after a token or two: verify steps of one to three
    sequences with 2-4 drafts, beside decodes, and on the hybrid model rolled-back chunks."""
    path = FAMILIES / "qwen3" / "qwen3-kquants.gguf" if fam == "qwen3" else family_gguf(fam, tmp_path)
    engine = graphed_engine(path)
    graphs = engine.runner.verify_graphs
    assert engine.speculator is not None and engine.model_config.is_hybrid == (fam != "qwen3")
    prompts = loop_prompts()
    expected = without_drafts(engine, prompts)
    assert graphs.replays == 0
    steps = record_verifies(engine.speculator)
    eager = record_eager_steps(engine, verify_only=True)
    assert_same(scored(engine, prompts), expected)
    assert any(accepted < drafted for drafted, accepted in steps), f"no draft rejected: {steps}"
    assert engine.speculator.accepted > 0
    assert graphs.replays >= 5, (graphs.replays, eager)
    assert all(graphs.shape_for(counts) is None for counts in eager), eager  # eager only where no graph holds it
    engine.scheduler.check_integrity()
    if engine.model_config.is_hybrid:
        assert_clean(engine)


def test_mtp_steps_replayed_from_graphs_keep_greedy_tokens_and_the_heads_drafts(tmp_path: Path) -> None:
    """With the MTP head every step that fits a verify graph replays one, plain decodes too, and hands the
    head every row's hidden state, and the head's chained draft steps replay their own graph: the drafts (so the counts of drafted and accepted tokens) are those
    of the same engine stepping eagerly, and the greedy tokens those without drafts."""
    _, path = mtp_model("qwen35", tmp_path, repeat=True)
    batch = mtp_prompts()
    eager = mtp_engine(path)
    eager_drafts = record_drafts(eager)
    expected = [r["token_ids"] for r in eager.generate(batch, GREEDY)]
    assert eager.speculator is not None and eager.speculator.accepted > 0
    graphed = mtp_engine(path)
    graphs = graphed.runner.verify_graphs = eager_verify_graphs(
        graphed.model, graphed.runner.kv_caches, graphed.max_model_len, 8, 3, keep_hidden=True
    )
    graphed.mtp.step_graph = step = eager_step_graph(graphed)
    eager_steps = record_eager_steps(graphed)
    drafts = record_drafts(graphed)
    assert [r["token_ids"] for r in graphed.generate(batch, GREEDY)] == expected
    assert drafts == eager_drafts
    assert graphed.speculator is not None
    assert (graphed.speculator.drafted, graphed.speculator.accepted) == (eager.speculator.drafted,
                                                                       eager.speculator.accepted)  # fmt: skip
    assert step.replays >= 10  # chained drafts: num_draft_tokens 3, so up to 2 a proposal
    assert graphs.replays >= 10 and all(graphs.shape_for(counts) is None for counts in eager_steps), eager_steps
    assert without_mtp(graphed, batch) == expected
    graphed.scheduler.check_integrity()


def test_a_prompt_admitted_beside_verify_steps_is_prefilled_in_the_same_replay(tmp_path: Path) -> None:
    """A short prompt arriving while another request verifies drafts: its prefill chunk and the verify
    chunk share a replay (the hybrid model's new state row starting from zeros beside a continued one),
    and both requests get the tokens and log-probs each gets alone without drafts."""
    engine = graphed_engine(family_gguf("qwen35", tmp_path))
    first, second = loop_prompts(2)
    second = second[:6]
    expected = [without_drafts(engine, [prompt])[0] for prompt in (first, second)]
    replayed: list[list[tuple[int, int, int]]] = []  # (start, tokens, drafts) of each replayed step's chunks
    run_graph = engine.runner._run_verify_graph

    def recording(chunks: list[Any]) -> Any:
        replayed.append([(c.start, c.num_tokens, len(c.draft_token_ids)) for c in chunks])
        return run_graph(chunks)

    engine.runner._run_verify_graph = recording  # type: ignore[method-assign]
    results: dict[str, list[Any]] = {"a": [], "b": []}
    engine.add_request("a", first, SCORED)
    while engine.speculator is not None and not engine.speculator.drafted:
        for out in engine.step():
            results[out.request_id] += list(zip(out.new_token_ids, out.logprobs or [], strict=True))
    engine.add_request("b", second, SCORED)
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id] += list(zip(out.new_token_ids, out.logprobs or [], strict=True))
    mixed = [step for step in replayed if any(s == 0 for s, _, _ in step) and any(d for _, _, d in step)]
    assert mixed, replayed  # b's whole prompt in a replay beside a's verify chunk
    for (tokens, top), rid in zip(expected, ("a", "b"), strict=True):
        assert [t for t, _ in results[rid]] == tokens
        got = np.array([[v for _, v in lp.top] for _, lp in results[rid]])
        assert np.abs(got - top).max() <= 1e-3
    assert_clean(engine)
