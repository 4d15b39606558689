"""The Studio's embedder setting: a Qwen3-Embedding folder (the tiny fixture of
tests/fixtures/make_qwen3_task_reference.py) embeds the Documents pane's set, and questions go
in after its task instruction as the model card embeds queries."""

from __future__ import annotations

import numpy as np

from app.engine.tasks.pooling import DecoderEmbedder
from app.studio.doc_qa import DocumentSet, default_embedder, embedder_source
from app.studio.settings import Settings, declaration
from tests.engine.qwen3_task_fixtures import DOCUMENTS, EMBEDDING, QUERIES, references


def test_the_setting_is_declared_and_empty_means_the_shipped_embedder(tmp_path):
    assert declaration("documents.embedding_model").kind == "path"
    assert Settings(tmp_path / "settings.json").get("documents.embedding_model") == ""
    assert embedder_source("") is default_embedder


def test_a_qwen3_embedding_folder_embeds_the_set_and_its_questions(tmp_path):
    source = embedder_source(str(EMBEDDING), "cpu")
    for number, text in enumerate(DOCUMENTS):
        (tmp_path / f"doc{number}.txt").write_text(text)
    documents = DocumentSet(source, min_relevance=-1.0)
    report = documents.ingest(sorted(tmp_path.glob("doc*.txt")))
    assert not report.failed and len(documents) == 2
    embedder = documents.embedder()
    assert isinstance(embedder, DecoderEmbedder) and embedder.model_name == "embedding"
    citations = documents.retrieve(QUERIES[0])
    # the question is embedded as the card embeds queries: the reference's query row
    query = references()["embeddings"][0]
    chunks = [c.hit.chunk.text for c in citations]
    scores = [c.hit.score for c in citations]
    expected = [float(embedder.embed([text])[0] @ query) for text in chunks]
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-4)
    assert scores == sorted(scores, reverse=True) and len(chunks) == 2
    beijing = next(c.hit.score for c in citations if c.hit.chunk.text == DOCUMENTS[0])
    assert abs(beijing - float(references()["embeddings"][2] @ query)) < 1e-4  # the card's own cosine
