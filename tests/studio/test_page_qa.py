"""PDF pages to a vision model as images (app/studio/page_qa.py), on the tiny random-weight
Gemma 3 vision model of tests/fixtures/vision: every page reaches the model as its own image
request, in order, with progress, and a cancel stops between pages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from studio.doc_files import write_pdf
from vision_engines import recording_vision_engine

from app.studio.documents import render_pages
from app.studio.page_qa import PagesCancelled, ask_pages, page_scale


@pytest.fixture(scope="module")
def client():
    with recording_vision_engine(512) as engine:
        yield engine


def test_both_pages_reach_the_model_as_images(tmp_path, client):
    pdf = write_pdf(tmp_path / "two.pdf", ["First page: apples.", "Second page: pears."])
    client.sent.clear()
    encoded = client.engine.runner.images.encoded
    steps = []
    answer = asyncio.run(ask_pages(client, pdf, "What fruit is named?", progress=lambda *a: steps.append(a)))
    assert [p.page for p in answer.pages] == [1, 2]
    assert len(client.sent) == 2
    rendered = render_pages(pdf, dpi=page_scale(client))  # the model's resolution, by default
    for request, page in zip(client.sent, rendered, strict=True):
        assert request.images  # the page, then its pan-and-scan crops
        expected = client.vision.prepare(_png(page)).views
        assert [v.key for v in request.images] == [v.key for v in expected]
        np.testing.assert_array_equal(request.images[0].pixel_values, expected[0].pixel_values)
        image_tokens = request.prompt_token_ids.count(client.vision.image_token_id)
        assert image_tokens == len(request.images) * client.vision.tokens_per_image
    assert client.sent[0].images[0].key != client.sent[1].images[0].key  # two different pages
    # every distinct view went through the tower once (the pages' blank lower crops are one content)
    distinct = {v.key for r in client.sent for v in r.images}
    assert client.engine.runner.images.encoded == encoded + len(distinct)
    assert steps[0] == (0, 2, "Reading page 1 of two.pdf (1 of 2)…") and steps[-1] == (2, 2, "Done")
    assert "[two.pdf, page 1]" in answer.text and "[two.pdf, page 2]" in answer.text


def test_cancel_stops_between_pages(tmp_path, client):
    pdf = write_pdf(tmp_path / "three.pdf")
    client.sent.clear()
    steps = []
    with pytest.raises(PagesCancelled, match="after 1 of 3 pages"):
        asyncio.run(
            ask_pages(
                client, pdf, "Price?", progress=lambda *a: steps.append(a), cancelled=lambda: len(steps) >= 1
            )
        )
    assert len(client.sent) == 1


def test_a_text_only_model_is_refused(tmp_path):
    from tests.server.fakes import FakeEngine

    with pytest.raises(ValueError, match="no vision"):
        asyncio.run(ask_pages(FakeEngine(), write_pdf(tmp_path / "a.pdf"), "?"))


def _png(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
