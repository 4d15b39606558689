"""The BERT encoder against sentence-transformers' vectors, and its edges (batching, truncation, errors).

The reference vectors were made by `tests/fixtures/make_embedding_reference.py`
(sentence-transformers, torch CPU, the same all-MiniLM-L6-v2 folder the app ships).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.engine.embeddings import (
    DEFAULT_EMBEDDING_MODEL,
    BertEmbedder,
    Embedder,
    EmbeddingResult,
    default_model_dir,
    load_default_embedder,
)
from app.engine.embeddings.ops import gelu, layer_norm, softmax_inplace
from app.engine.embeddings.pooling import PoolingConfig, l2_normalize, last_token_pool
from app.engine.embeddings.tokenization import plan_batches

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings"


@pytest.fixture(scope="module")
def reference() -> tuple[list[dict], np.ndarray]:
    meta = json.loads((FIXTURES / "minilm_sentences.json").read_text(encoding="utf-8"))
    return meta["sentences"], np.load(FIXTURES / "minilm_reference.npy")


@pytest.fixture(scope="module")
def embedder() -> BertEmbedder:
    return load_default_embedder()


@pytest.fixture(scope="module")
def fixture_result(embedder: BertEmbedder, reference: tuple[list[dict], np.ndarray]) -> EmbeddingResult:
    sentences, _ = reference
    return embedder.encode([s["text"] for s in sentences])


def test_default_model_describes_itself(embedder: BertEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.model_name == DEFAULT_EMBEDDING_MODEL
    assert embedder.dimensions == 384
    assert embedder.max_tokens == 256  # sentence_bert_config.json, not the tokenizer file's 128


def test_vectors_match_sentence_transformers(
    fixture_result: EmbeddingResult, reference: tuple[list[dict], np.ndarray]
) -> None:
    sentences, expected = reference
    got = fixture_result.vectors
    assert got.dtype == np.float32 and got.shape == expected.shape
    cosines = (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    worst = [
        (round(float(c), 6), s["text"][:40]) for c, s in zip(cosines, sentences, strict=True) if c < 0.999
    ]
    assert not worst, f"cosine below 0.999 for {worst}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_token_counts_and_truncation_match_the_reference(
    embedder: BertEmbedder, fixture_result: EmbeddingResult, reference: tuple[list[dict], np.ndarray]
) -> None:
    sentences, _ = reference
    assert fixture_result.token_counts == [s["tokens_seen"] for s in sentences]
    assert embedder.count_tokens([s["text"] for s in sentences]) == [s["tokens_full"] for s in sentences]
    assert fixture_result.truncated == [s["tokens_full"] > 256 for s in sentences]
    assert sum(fixture_result.truncated) >= 4  # the fixture set really exercises the cut
    assert fixture_result.total_tokens == sum(s["tokens_seen"] for s in sentences)


def test_padding_in_a_batch_does_not_change_a_vector(embedder: BertEmbedder) -> None:
    texts = ["short", "a somewhat longer sentence that forces the short one to be padded in its batch"]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-6)


def test_rows_come_back_in_input_order(embedder: BertEmbedder) -> None:
    texts = ["one two three four five six", "alpha", "a medium length text here", ""]
    forward = embedder.embed(texts)
    backward = embedder.embed(texts[::-1])
    np.testing.assert_allclose(forward, backward[::-1], atol=2e-6)


def test_small_batches_give_the_same_vectors(reference: tuple[list[dict], np.ndarray]) -> None:
    sentences, expected = reference
    short = [i for i, s in enumerate(sentences) if s["tokens_full"] < 40][:12]
    tiny_batches = BertEmbedder.from_dir(default_model_dir())
    tiny_batches.max_batch_tokens, tiny_batches.max_batch_size = 64, 3
    got = tiny_batches.embed([sentences[i]["text"] for i in short])
    assert np.min((got * expected[short]).sum(axis=1)) >= 0.999


def test_empty_input_gives_an_empty_matrix(embedder: BertEmbedder) -> None:
    result = embedder.encode([])
    assert result.vectors.shape == (0, 384) and result.token_counts == [] and result.truncated == []
    assert embedder.count_tokens([]) == []


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ("a bare string", "texts must be a list of strings, got str"),
        (["fine", 3], r"texts\[1\] must be a string"),
    ],
)
def test_bad_texts_are_named(embedder: BertEmbedder, texts: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        embedder.embed(texts)  # type: ignore[arg-type]


def test_missing_folder_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertEmbedder.from_dir(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"lacks model\.safetensors, tokenizer\.json"):
        BertEmbedder.from_dir(tmp_path)


def test_a_non_bert_config_is_refused(tmp_path: Path) -> None:
    source = default_model_dir()
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).symlink_to(source / name)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama' is not a BERT encoder"):
        BertEmbedder.from_dir(tmp_path)


def test_plain_folder_without_sentence_transformers_files_uses_mean_pooling(tmp_path: Path) -> None:
    source = default_model_dir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).symlink_to(source / name)
    plain = BertEmbedder.from_dir(tmp_path, model_name="plain")
    assert plain.max_tokens == 512  # no sentence_bert_config.json: the model's position range
    np.testing.assert_allclose(
        plain.embed(["same text"]), load_default_embedder().embed(["same text"]), atol=1e-6
    )


# -- building blocks against independent formulas ---------------------------------------


def test_gelu_matches_math_erf() -> None:
    x = np.linspace(-12, 12, 4001, dtype=np.float32)
    expected = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(gelu(np, x, "erf"), expected, atol=2e-6)
    tanh_expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(gelu(np, x, "tanh"), tanh_expected, atol=1e-5)


def test_layer_norm_and_softmax_match_direct_formulas() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 16)).astype(np.float32)
    w, b = rng.normal(size=16).astype(np.float32), rng.normal(size=16).astype(np.float32)
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12) * w + b
    np.testing.assert_allclose(layer_norm(np, x, w, b, 1e-12), expected, atol=1e-5)
    scores = rng.normal(size=(2, 3, 7)).astype(np.float32) * 5
    expected_sm = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.testing.assert_allclose(softmax_inplace(np, scores.copy()), expected_sm, atol=1e-6)


def test_pooling_ignores_padding() -> None:
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    hidden[1, 2] = 1000.0  # a padded position with a value that would dominate mean and max
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    mean = PoolingConfig(("pooling_mode_mean_tokens",)).pool(np, hidden, mask)
    np.testing.assert_allclose(mean, [hidden[0].mean(0), hidden[1, :2].mean(0)])
    both = PoolingConfig(("pooling_mode_cls_token", "pooling_mode_max_tokens")).pool(np, hidden, mask)
    np.testing.assert_allclose(both[1], np.concatenate([hidden[1, 0], hidden[1, :2].max(0)]))
    np.testing.assert_allclose(last_token_pool(np, hidden, mask), [hidden[0, 2], hidden[1, 1]])
    left_padded = np.array([[1, 1, 1], [0, 1, 1]])
    np.testing.assert_allclose(last_token_pool(np, hidden, left_padded), [hidden[0, 2], hidden[1, 2]])
    np.testing.assert_allclose(np.linalg.norm(l2_normalize(np, mean), axis=1), 1.0, rtol=1e-6)


def test_unknown_pooling_mode_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(ValueError, match=r"unsupported pooling mode.*weightedmean"):
        PoolingConfig.from_file(path)


def test_batches_cover_every_text_once_within_the_budget() -> None:
    lengths = [5, 256, 17, 3, 256, 40, 41, 2, 9, 120]
    batches = plan_batches(lengths, max_batch_tokens=300, max_batch_size=4)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 4
        members = [lengths[i] for i in batch]
        assert len(batch) == 1 or len(batch) * max(members) <= 300
        # Short texts are not padded up to long ones' length.
        assert min(members) >= 0.75 * max(members) or max(members) - min(members) < 8


def test_tokenizing_in_groups_gives_what_one_batch_gives(
    embedder: BertEmbedder, reference: tuple[list[dict], np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Texts are encoded a bounded group of characters at a time (the library holds every Encoding of a
    call at once); the grouping changes nothing the model reads or the counts report."""
    from app.engine.embeddings import tokenization

    texts = [s["text"] for s in reference[0]]
    whole = embedder.tokenizer.tokenize(texts)
    counts = embedder.tokenizer.count(texts)
    monkeypatch.setattr(tokenization, "GROUP_CHARS", max(len(t) for t in texts) // 2)
    assert len(tokenization._groups(texts)) > 1  # really split
    assert embedder.tokenizer.tokenize(texts) == whole
    assert embedder.tokenizer.count(texts) == counts
