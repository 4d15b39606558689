"""The models suggested (chat models for a base model, task models beside them): verdicts equal to `paddock
fit`'s on files with the same headers (hybrids' recurrent state and attention layers, Gemma 4's shared KV,
task models as the engine runs them), shown with sizes and what each does in the hub tab's opening view, one
click to download, reached from the chat."""

from __future__ import annotations

import argparse
import json
import os

import gguf
import numpy as np
import pytest
from PySide6.QtCore import Qt
from studio.fake_hub import FakeHub, make_tiny_gguf

from app.commands import fit as fit_command
from app.engine.plan import fit as fit_module
from app.engine.plan.fit import DeviceMemory, FitOptions, is_task_job
from app.studio.recommendations import RECOMMENDED, Recommendation, recommended_fits
from app.studio.runtime import fit_options
from app.ui.widgets.recommended_view import JOB_COLUMN, NO_SPEED

GPUS = [
    DeviceMemory("cuda", f"test GPU {gb} GB", int(gb * 0.95 * 2**30), gb * 2**30) for gb in (4, 8, 12, 24, 80)
]
WAIT_MS = 15_000


def add_key(writer: gguf.GGUFWriter, key: str, value) -> None:
    """A header value as llama.cpp's converter writes it: counts as uint32, per-layer lists as arrays."""
    if isinstance(value, list):
        writer.add_array(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_uint32(key, int(value))


def write_gguf_like(rec: Recommendation, path) -> None:
    """A GGUF with `rec`'s header keys, its named tensors (tiny) and one F32 tensor making up the rest of its
    size, the data left sparse (no disk used)."""
    writer = gguf.GGUFWriter(str(path), rec.architecture)
    for key, value in rec.gguf_metadata().items():
        if key != "general.architecture":
            add_key(writer, key, value)
    parts = {name: 64 for name in rec.tensors}  # a reranker's head, as a stand-in of 16 floats
    parts["weights"] = rec.size_bytes - sum(parts.values())
    for name, nbytes in parts.items():
        writer.add_tensor_info(name, (nbytes // 4,), np.dtype(np.float32), nbytes,
                               raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    data_start = -(-os.path.getsize(path) // 32) * 32
    os.truncate(path, data_start + rec.size_bytes)


def _paddock_fit(path, capsys) -> dict:
    parser = argparse.ArgumentParser()
    fit_command.add_arguments(parser)  # the command's own defaults, as `paddock fit FILE --json` gets them
    assert fit_command.run(parser.parse_args([str(path), "--json"])) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda d: d.name)
def test_the_recommended_verdicts_equal_paddock_fit_on_the_same_files(gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fit_module, "device_memory", lambda: gpu)  # the one GPU both are asked about
    listed = recommended_fits(FitOptions())  # the Studio's defaults: what the Settings start from
    verdicts = set()
    for row in listed:
        path = tmp_path / row.recommendation.file
        write_gguf_like(row.recommendation, path)
        report = _paddock_fit(path, capsys)
        # as JSON (tuples become lists): the shape paddock fit read from the header is the one listed; a
        # mixture of experts' expert bytes are the file's tensors' there (none here), the header's estimate here
        listed_shape = json.loads(json.dumps(row.recommendation.shape.__dict__))
        assert {**report["shape"], "expert_bytes": 0} == {**listed_shape, "expert_bytes": 0}, row.recommendation.title
        assert report["job"] == row.recommendation.job  # what it does, read from the file as from the table
        assert (row.report.verdict, row.report.max_context) == (report["verdict"], report["max_context"])
        assert row.report.breakdown.total == report["breakdown"]["total"]
        assert (row.report.kv_blocks, row.report.engine_context) == (report["kv_blocks"], report["engine_context"])
        path.unlink()
        verdicts.add(row.report.verdict)
    assert len(verdicts) >= 2 or gpu.total_bytes >= 80 * 2**30  # the list spans what fits and what does not


def test_every_recommendation_is_a_gguf_the_engine_runs():
    from app.engine.models.registry import family

    assert len({r.file for r in RECOMMENDED}) == len(RECOMMENDED)
    for rec in RECOMMENDED:
        family(rec.architecture)  # a family the engine has (UnsupportedArchitecture otherwise)
        shape = rec.shape
        assert rec.file.endswith(".gguf") and rec.repo_id.count("/") == 1 and shape.num_heads % shape.num_kv_heads == 0
        assert rec.size_bytes > shape.num_layers * shape.hidden_size**2 // 2  # Q4: at least half a byte per weight
        if rec.attention_layers is not None:  # the card's count of layers with a KV cache is the header's
            assert len(shape.kv_layers) == rec.attention_layers, rec.title
    jobs = {rec.title: rec.job for rec in RECOMMENDED}
    assert jobs["Qwen3-Embedding 0.6B"] == "embeddings" and jobs["Qwen3-Reranker 0.6B"] == "reranking"
    assert {jobs["Qwen3.5 27B"], jobs["Gemma 4 E4B IT"], jobs["Qwen3 8B"]} == {"chat"}


def test_the_hybrids_state_and_gemma4s_shared_kv_are_the_model_cards():
    """Counted by hand from the cards and configs: Qwen3.5 27B's 48 Gated DeltaNet layers each hold a float32 state of
    48 value heads x 128 x 128 and a 3-step convolution window over q, k (16 heads x 128 each) and v;
    Gemma 4 E4B's 24 cache-owning layers are 20 sliding ones (2 KV heads x 256) and 4 global (2 x 512)."""
    by_title = {rec.title: rec for rec in RECOMMENDED}
    qwen = by_title["Qwen3.5 27B"].shape
    per_layer = 48 * 128 * 128 + 3 * (2 * 16 * 128 + 48 * 128)
    assert qwen.state_bytes_per_sequence == 48 * per_layer * 4
    assert qwen.kv_bytes_per_token(2) == 16 * 2 * 4 * 256 * 2  # float16 K and V of 16 attention layers
    gemma = by_title["Gemma 4 E4B IT"].shape
    assert sorted(set(gemma.kv_layers)) == [(2, 256), (2, 512)] and gemma.kv_layers.count((2, 512)) == 4
    assert gemma.kv_bytes_per_token(2) == (20 * 2 * 256 + 4 * 2 * 512) * 2 * 2
    moe = by_title["Qwen3.5 35B-A3B"].shape
    assert (moe.num_experts, moe.experts_used) == (256, 8) and 0 < moe.expert_bytes < moe.weight_bytes
    # Nemotron 3 Nano: 23 Mamba-2 layers of 64 heads x 64 x state 128, a 3-step window over x (64 x 64) and
    # B, C (8 groups x 128 each); 6 attention layers of 2 KV heads x 128
    nemotron = by_title["Nemotron 3 Nano 30B-A3B"].shape
    assert nemotron.state_bytes_per_sequence == 23 * (64 * 64 * 128 + 3 * (64 * 64 + 2 * 8 * 128)) * 4
    assert nemotron.kv_layers == ((2, 128),) * 6 and (nemotron.num_experts, nemotron.experts_used) == (128, 6)


def test_gemma4_31b_and_26b_a4b_are_llama_quantizes_q4_k_m_of_the_published_configs():
    """No byte count of these two files was found: their sizes are the tensor bytes of llama-quantize's Q4_K_M
    choices on the published configs as bench/make_random_gguf.py lays them out (GEMMA4_SHAPES), and their headers
    give the same shapes."""
    import importlib.util
    import sys
    from pathlib import Path

    from app.engine.quant.types import QUANT_TYPES

    spec = importlib.util.spec_from_file_location(
        "make_random_gguf", Path(__file__).resolve().parents[2] / "bench" / "make_random_gguf.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, bench)  # its dataclasses look their module up by name
    spec.loader.exec_module(bench)
    by_title = {rec.title: rec for rec in RECOMMENDED}
    for title, name in (("Gemma 4 31B IT", "gemma4-31b"), ("Gemma 4 26B-A4B IT", "gemma4-26b-a4b")):
        config, rec = bench.GEMMA4_SHAPES[name], by_title[title]
        types = bench.gemma4_tensor_types(config)
        matrices = sum(
            QUANT_TYPES[types[tensor]].row_bytes(dims[-1]) * int(np.prod(dims[:-1]))
            for tensor, dims in bench.gemma4_matrices(config).items()
        )
        vectors = sum(v.nbytes for v in bench.gemma4_vectors(config, np.random.default_rng(0)).values())
        assert rec.size_bytes == matrices + vectors, title
        shape = rec.shape
        assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.vocab_size) == (
            config.layers, config.hidden, config.heads, config.vocab
        ), title
        assert shape.kv_layers == tuple(config.geometry(i) for i in range(config.layers)), title
        assert (shape.num_experts, shape.experts_used) == (config.experts, config.experts_used), title


@pytest.fixture
def tiny_hub(tmp_path_factory, monkeypatch):
    """A fake hub that serves a tiny GGUF under the first recommendation's repo and file name."""
    data = make_tiny_gguf(tmp_path_factory.mktemp("src") / "tiny.gguf")
    rec = RECOMMENDED[0]
    fake = FakeHub()
    fake.add_repo(rec.repo_id, {rec.file: data, "README.md": b"# tiny\n"}, tags=("gguf",), downloads=1)
    fake.serve(monkeypatch)
    yield rec, data
    fake.stop()


def test_the_hub_tab_opens_on_the_recommendations_and_downloads_one_in_a_click(
    qtbot, make_window, home, tiny_hub, monkeypatch
):
    monkeypatch.setattr(fit_module, "device_memory", lambda: GPUS[1])
    rec, data = tiny_hub
    window = make_window(panes=("models",))
    browser = window.pane("models").hub
    view = browser.recommended
    assert browser.left.currentWidget() is view  # the opening view, before any search
    qtbot.waitUntil(lambda: view.table.item(0, 3).text() != "", timeout=WAIT_MS)
    expected = recommended_fits(fit_options(window.context.settings), GPUS[1])  # at the chat's context
    for row, fit in enumerate(expected):
        assert view.table.item(row, 0).text() == fit.recommendation.title
        assert view.table.item(row, JOB_COLUMN).text() == fit.recommendation.job
        context = min(8192, fit.recommendation.context) // 1024
        assert view.table.item(row, 3).text().startswith(f"{fit.report.verdict.upper()} at {context}k (max ")
    assert view.table.item(0, 2).text() == "468.25 MiB"  # 491 MB
    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as done:
        qtbot.mouseClick(view.get_buttons[0], Qt.MouseButton.LeftButton)
    assert done.args[0].ok
    downloaded = next((home / "models").rglob(rec.file))
    assert downloaded.read_bytes() == data


def test_a_base_model_is_named_in_the_chat_which_leads_to_a_chat_model(
    qtbot, make_window, make_context, home
):
    folder = home / "models"
    folder.mkdir(parents=True)
    make_tiny_gguf(folder / "tiny-base.gguf")  # no chat template in its header: a base model

    from server.fakes import FakeEngine

    class EngineAt(FakeEngine):
        @property
        def model(self):
            import dataclasses

            return dataclasses.replace(super().model, name="tiny-base", path=str(folder / "tiny-base.gguf"))

    context = make_context(engine_factory=lambda config: EngineAt())
    window = make_window(context, panes=("chat", "models"))
    chat = window.pane("chat")
    window.load_model(str(folder / "tiny-base.gguf"))
    qtbot.waitUntil(lambda: chat.base_note.isVisibleTo(chat), timeout=WAIT_MS)
    assert "tiny-base is a base model" in chat.base_note_text.text()
    assert chat.base_note_text.text().count("\n") == 0
    qtbot.mouseClick(chat.get_chat_model, Qt.MouseButton.LeftButton)
    models = window.pane("models")
    assert window.stack.currentWidget() is models and models.tabs.currentWidget() is models.hub
    assert models.hub.left.currentWidget() is models.hub.recommended

    context.host.adopt(FakeEngine())  # an instruct model (no file to read): no note
    qtbot.waitUntil(lambda: not chat.base_note.isVisibleTo(chat), timeout=WAIT_MS)


def test_on_a_24_gb_cpu_each_row_shows_its_verdict_at_8k_its_breakdown_and_its_speed(
    qtbot, make_window, monkeypatch
):
    from app.studio import recommendations

    cpu = DeviceMemory("cpu", "no GPU: CPU RAM", 24 * 2**30, 24 * 2**30)
    monkeypatch.setattr(fit_module, "device_memory", lambda: cpu)
    monkeypatch.setattr(recommendations, "memory_bandwidth", lambda kind: 20e9)  # 20 GB/s measured
    window = make_window(panes=("models",))
    window.show()
    browser = window.pane("models").hub
    view = browser.recommended
    qtbot.waitUntil(lambda: len(view.fits) == len(RECOMMENDED), timeout=WAIT_MS)
    titles = [rec.title for rec in RECOMMENDED]
    llama = titles.index("Llama 3.2 3B Instruct")
    assert view.table.item(llama, 3).text() == "FITS at 8k (max 128k)"
    assert view.table.item(llama, 4).text() == "~9.9 tok/s"
    assert view.table.item(titles.index("Qwen3 8B"), 4).text() == "~4.0 tok/s, slow"

    def pick(row: int) -> None:
        qtbot.mouseClick(
            view.table.viewport(),
            Qt.MouseButton.LeftButton,
            pos=view.table.visualRect(view.table.model().index(row, 0)).center(),
        )

    for row, rec in enumerate(RECOMMENDED):  # every row's breakdown, before anything is downloaded
        pick(row)
        assert browser.fit.report is view.fits[row].report, rec.title
        assert all(
            browser.fit.parts[key].text() for key in ("weights", "kv_cache", "activations", "overhead")
        )
        assert f"the model's maximum: {rec.context:,}" in browser.fit.headline.text()
        assert rec.repo_id in browser.repo.text()
        if is_task_job(rec.job):  # an embedder or a reranker: judged as its engine runs, no decode speed
            assert view.table.item(row, 4).text() == NO_SPEED and view.fits[row].report.kv_blocks == 8192 // 16 + 1
        else:
            assert "tokens/s" in browser.fit.speed.text()
    pick(titles.index("Qwen3 32B"))
    assert browser.fit.verdict.text() != "" and "answers will come slowly" in browser.fit.speed.text()
    assert browser.fit.speed.objectName() == "hintText"  # "fits but slow" stands out
