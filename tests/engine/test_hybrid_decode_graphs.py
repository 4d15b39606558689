"""A hybrid model's decode step through DecodeGraphs' data path, on the numpy backend (no GPU).

A captured step has device arrays only: DecodeGraphs stages each row's token, position, block table,
state row and start in one buffer and its forward hands views of it to the layers. Run on the numpy
backend over a stand-in for CuPy (test_decode_graphs_staging's), that forward must give the logits and
state rows the runner's eager step gives: sequences continuing their state rows, one starting from
zeros in a row that holds another's leftovers, and a padding row that writes only the null row 0.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest
from hybrid_gguf import write_mamba_gguf  # sibling modules: pytest puts tests/engine on sys.path
from test_decode_graphs_staging import _fake_cupy, _Graph
from test_hybrid_qwen import BLOCK, MAX_POSITIONS, Runner

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.options import KernelOptions
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model
from app.engine.worker.decode_graphs import DecodeGraphs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"


class _DeviceMetadataOnly(CpuBackend):
    """The numpy backend given a captured step's metadata, which carries device arrays only: the
    references' host copies are those same arrays (numpy here)."""

    def causal_conv1d(self, x, weight, bias, conv_state, meta: AttentionMetadata, silu: bool = True):
        meta = dataclasses.replace(
            meta, host_query_start_loc=np.asarray(meta.query_start_loc), host_state_slots=np.asarray(meta.state_slots),
            host_has_initial_state=np.asarray(meta.has_initial_state),
        )  # fmt: skip
        return super().causal_conv1d(x, weight, bias, conv_state, meta, silu)


@pytest.mark.parametrize(("fam", "arch"), [("nemotron_h", "nemotron_h"), ("granite_hybrid_dense", "granitehybrid")])
def test_a_staged_decode_step_equals_the_eager_one(fam: str, arch: str, tmp_path: Path) -> None:
    path = write_mamba_gguf(FIXTURES / fam / "hf", arch, tmp_path / f"{fam}.gguf")
    model = build_model(open_checkpoint(path), _DeviceMetadataOnly(), MAX_POSITIONS)
    tokens = list(range(3, 40))
    runner = Runner(model)
    runner.step([(3, tokens[:13], 0), (5, tokens[13:22], 0)])  # two prompts into state rows 3 and 5
    before = copy.deepcopy(runner.caches)
    # a decode step: rows 3 and 5 continue, a one-token prompt starts from zeros in row 7 (holding noise)
    chunks = [(3, [tokens[30]], 13), (5, [tokens[31]], 9), (7, [tokens[32]], 0)]
    eager = np.concatenate(runner.step(chunks))

    backend = types.SimpleNamespace(xp=_fake_cupy(), kernel_options=KernelOptions(cascade_attention=False))
    graphs = DecodeGraphs(model, backend, before, BLOCK, MAX_POSITIONS, max_batch=4)
    graphs._graphs = {n: (_Graph(), np.zeros((n, 1))) for n in graphs.buckets}
    positions = np.array([start for _, _, start in chunks], np.int32)
    width = max(len(runner.tables[slot]) for slot, _, _ in chunks)
    tables = np.array([runner.tables[s] + [0] * (width - len(runner.tables[s])) for s, _, _ in chunks], np.int32)
    graphs.run(np.array([t[0] for _, t, _ in chunks], np.int32), positions, positions + 1, tables,
               state_slots=np.array([s for s, _, _ in chunks], np.int32), has_initial_state=positions > 0)  # fmt: skip
    bucket = graphs.bucket_for(len(chunks))
    assert bucket == 4  # one padding row
    staged = np.asarray(graphs._forward(bucket), np.float32)[: len(chunks)]  # what the capture records

    np.testing.assert_allclose(staged, eager, rtol=1e-5, atol=1e-5 * float(np.abs(eager).max()))
    for layer, (got, want) in enumerate(zip(before, runner.caches, strict=True)):
        if model.config.state_shapes(layer) is None:
            continue
        for g, w in zip(got, want, strict=True):  # every state row but the null row 0 the padding row used
            # the padded batch may sum in another order (BLAS picks kernels by shape): float32 rounding at the
            # states' scale, as for the outputs above
            np.testing.assert_allclose(g[1:], w[1:], rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(w).max())),
                                       err_msg=f"layer {layer}")  # fmt: skip
