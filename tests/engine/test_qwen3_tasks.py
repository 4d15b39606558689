"""Qwen3-Embedding and Qwen3-Reranker loaded as their own engines (tasks/task_model.py), against
what their model cards compute with transformers (tests/fixtures/make_qwen3_task_reference.py:
tiny random-weight models; the card's batched, left-padded code run on them).

Tolerances: float32 against float32 in another summation order (and the card's left padding,
which moves RoPE positions): 1e-4 on every component and score, cosine above 0.9999."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.engine.loader.names import CheckpointError
from app.engine.loader.tokenizer import Tokenizer
from app.engine.tasks.pooling import query_prompt
from app.engine.tasks.rerank import DECODER_YES_NO, qwen3_reranker_prompt, rerank
from app.engine.tasks.task_model import (
    TaskModel,
    is_decoder_model,
    load_decoder_embedder,
    load_decoder_reranker,
)
from tests.engine.gguf_forge import Forge
from tests.engine.qwen3_task_fixtures import (
    DOCUMENTS,
    EMBEDDING,
    EMBEDDING_GGUF,
    MANIFEST,
    QUERIES,
    RERANKER,
    RERANKER_GGUF,
    TASKS,
    references,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return references()


@pytest.fixture(scope="module", params=["folder", "gguf"])
def embedder(request):
    return load_decoder_embedder(EMBEDDING if request.param == "folder" else EMBEDDING_GGUF, device="cpu")


@pytest.fixture(scope="module", params=["folder", "gguf"])
def reranker(request):
    return load_decoder_reranker(RERANKER if request.param == "folder" else RERANKER_GGUF, device="cpu")


def _close(ours: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4)
    cosines = (
        (ours * reference).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    )
    assert cosines.min() > 0.9999


def test_the_fixtures_stay_small():
    assert sum(f.stat().st_size for f in TASKS.rglob("*") if f.is_file()) < 1024 * 1024


def test_queries_and_documents_are_tokenized_as_the_card_does(embedder):
    # the folder's config_sentence_transformers.json prompt, or (GGUF) the card's own: the same text
    assert embedder.query_prefix == query_prompt(MANIFEST["task"])
    texts = embedder.query_texts(QUERIES) + DOCUMENTS
    ids = [embedder._ids(text) for text in texts]
    assert ids == MANIFEST["embedding_token_ids"]  # ending in <|endoftext|>, the token pooled
    assert embedder.count_tokens(texts) == [len(i) for i in ids]


def test_embeddings_match_the_model_card(embedder, refs):
    vectors = np.concatenate([embedder.embed_queries(QUERIES), embedder.embed(DOCUMENTS)])
    assert vectors.shape == (4, 64) and vectors.dtype == np.float32
    _close(vectors, refs["embeddings"])


def test_dimensions_cut_and_renormalise_as_the_model_card_allows(embedder, refs):
    cut = MANIFEST["mrl_dimensions"]
    vectors = embedder.embed(embedder.query_texts(QUERIES) + DOCUMENTS, dimensions=cut)
    assert vectors.shape == (4, cut)
    _close(vectors, refs["embeddings_mrl"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert embedder.min_dimensions == 32 and embedder.dimensions == 64
    for wrong in (31, 65):
        with pytest.raises(ValueError, match=f"gives 32 to 64 dimensions, not {wrong}"):
            embedder.embed(DOCUMENTS, dimensions=wrong)


def test_an_instruction_replaces_the_default_task(embedder):
    custom = embedder.query_texts(["q"], "Find the code")
    assert custom == ["Instruct: Find the code\nQuery:q"]
    assert not np.allclose(embedder.embed(custom), embedder.embed_queries(["q"]))


def test_rerank_scores_match_the_model_card(reranker, refs):
    prompts = [qwen3_reranker_prompt(q, d, MANIFEST["task"]) for q in QUERIES for d in DOCUMENTS]
    # one encode of the whole prompt gives the card's prefix + pair + suffix ids
    tokenizer = Tokenizer.from_pretrained_dir(RERANKER)
    assert [tokenizer.encode(p) for p in prompts] == MANIFEST["rerank_token_ids"]
    scores = [s for q in QUERIES for s in reranker.score(q, DOCUMENTS).scores]
    np.testing.assert_allclose(scores, refs["rerank_scores"], rtol=0, atol=1e-4)


def test_rerank_orders_documents_by_the_reranker(reranker, refs):
    ranking = rerank(QUERIES[0], DOCUMENTS, reranker=reranker)
    assert ranking.method == DECODER_YES_NO and ranking.model in ("reranker", "reranker-f16")
    expected = refs["rerank_scores"][: len(DOCUMENTS)]
    assert [r.index for r in ranking.results] == list(np.argsort(-expected))
    assert ranking.total_tokens == sum(len(i) for i in MANIFEST["rerank_token_ids"][: len(DOCUMENTS)])


def test_a_task_model_runs_one_call_at_a_time(reranker):
    task = TaskModel.load(EMBEDDING_GGUF, "embedding", device="cpu", context=64)
    assert task.engine.max_model_len == 64 and task.engine.config.max_num_seqs == 1
    assert task.run(lambda: task._lock.locked()) and not task._lock.locked()


def test_which_models_are_decoders(tmp_path):
    assert is_decoder_model(EMBEDDING) and is_decoder_model(EMBEDDING_GGUF) and is_decoder_model(RERANKER)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    assert not is_decoder_model(bert) and not is_decoder_model(tmp_path / "missing")


# -- files that are not what they should be -----------------------------------------------------


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_missing_and_wrong_kinds_of_file_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"embedding model {tmp_path / 'nope'} does not exist"):
        load_decoder_embedder(tmp_path / "nope", device="cpu")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(
        CheckpointError, match=r"rerank model .*notes.txt: not a \.gguf file or a model folder"
    ):
        load_decoder_reranker(text, device="cpu")
    mmproj = FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf"  # a vision tower, not a language model
    with pytest.raises(CheckpointError, match=r"mmproj-gemma3\.gguf.*clip"):
        load_decoder_embedder(mmproj, device="cpu")
    with pytest.raises(
        CheckpointError, match=r"rerank model .*embedding: this is an embedding model \(modules"
    ):
        load_decoder_reranker(EMBEDDING, device="cpu")
    bytes_only = FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf"  # no single "yes"/"no" tokens
    with pytest.raises(
        CheckpointError, match=r"rerank model .*qwen3-kquants\.gguf: .*'yes' and 'no' are not single"
    ):
        load_decoder_reranker(bytes_only, device="cpu")


def test_a_classifier_head_that_is_not_yes_no_is_named(tmp_path):
    forge = Forge.of(RERANKER_GGUF)
    forge.metadata["qwen3.classifier.output_labels"] = ["relevant", "irrelevant"]
    bad = forge.write(tmp_path / "labels.gguf")
    with pytest.raises(CheckpointError, match=r"labels\.gguf: cls\.output\.weight of shape \[2, 64\] with "
                       r"labels \['relevant', 'irrelevant'\] is not a yes/no head"):  # fmt: skip
        load_decoder_reranker(bad, device="cpu")


def test_truncated_checkpoints_are_named(tmp_path):
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(EMBEDDING_GGUF.read_bytes()[: EMBEDDING_GGUF.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"cut\.gguf.*truncated"):
        load_decoder_embedder(gguf, device="cpu")
    folder = _copy(RERANKER, tmp_path / "reranker")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated or corrupt"):
        load_decoder_reranker(folder, device="cpu")


def test_a_corrupt_tokenizer_is_named(tmp_path):
    folder = _copy(EMBEDDING, tmp_path / "embedding")
    (folder / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(CheckpointError, match=r"embedding model: .*tokenizer\.json is not a valid tokenizer\.json"):
        load_decoder_embedder(folder, device="cpu")


def test_corrupt_sentence_transformers_files_are_named(tmp_path):
    folder = _copy(EMBEDDING, tmp_path / "embedding")
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}))
    with pytest.raises(
        CheckpointError, match=r"1_Pooling pools by pooling_mode_mean_tokens; a decoder embeds"
    ):
        load_decoder_embedder(folder, device="cpu")
    (folder / "modules.json").write_text('[{"type": ')
    with pytest.raises(CheckpointError, match=r"modules\.json: not valid JSON"):
        load_decoder_embedder(folder, device="cpu")
    (folder / "modules.json").unlink()
    (folder / "config_sentence_transformers.json").write_text("{]")
    with pytest.raises(CheckpointError, match=r"config_sentence_transformers\.json: not valid JSON"):
        load_decoder_embedder(folder, device="cpu")
    (folder / "config_sentence_transformers.json").write_text('{"prompts": ["query"]}')
    with pytest.raises(CheckpointError, match=r"config_sentence_transformers\.json: expected \{\"prompts\""):
        load_decoder_embedder(folder, device="cpu")
    (folder / "config_sentence_transformers.json").write_text('{"similarity_fn_name": "cosine"}')
    assert load_decoder_embedder(folder, device="cpu").query_prefix == query_prompt()  # the card's own


def test_serve_and_mcp_refuse_a_bad_task_model_naming_it(tmp_path, capsys):
    chat = str(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf")
    base = ["serve", "--model", chat, "--device", "cpu", "--port", "0", "--no-mcp"]
    assert main([*base, "--embedding-model", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}" in capsys.readouterr().err
    text = tmp_path / "model.bin"
    text.write_bytes(b"\0" * 64)
    assert main([*base, "--no-embeddings", "--rerank-model", str(text)]) == 2
    assert "not a .gguf file or a model folder" in capsys.readouterr().err
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(EMBEDDING_GGUF.read_bytes()[:4096])
    assert main(["mcp", "--model", chat, "--device", "cpu", "--embedding-model", str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paddock mcp: embedding model") and "cut.gguf" in err


def test_the_larger_models_layout_untied_without_an_lm_head_embeds_the_same(tmp_path, refs):
    # Qwen3-Embedding-4B/8B: tie_word_embeddings false and, saved as a Qwen3Model, no lm_head at all
    folder = _copy(EMBEDDING, tmp_path / "embedding-8b-layout")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    embedder = load_decoder_embedder(folder, device="cpu")
    _close(embedder.embed(DOCUMENTS), refs["embeddings"][len(QUERIES) :])
