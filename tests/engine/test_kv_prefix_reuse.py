"""Prefix reuse on the embedded Gemma 3 270M (numpy backend): from the device tree, the host tier,
the disk tier, and the disk tier after a restart; each against a `--prefix-cache off` run.

A second request shares a 1,500-token prefix with the first; it must report >= 1,400 cached
tokens, from the tier the test put them in, and produce exactly the greedy tokens the engine
produces with no prefix reuse at all.
"""

from __future__ import annotations

import itertools

import pytest

from app.engine import EngineConfig, SamplingParams
from app.engine.core.engine import LLMEngine

pytestmark = pytest.mark.slow  # three engines and two 1,500-token prefills: minutes on 2 cores

PREFIX_TOKENS = 1500
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
TEXT = (
    "The river rises in the hills above the town and runs south through the valley, past the mill, "
    "the old stone bridge and the fields where the farmers grow wheat and barley every summer. "
)


_ids = itertools.count()


def config(**fields: object) -> EngineConfig:
    return EngineConfig(device="cpu", max_model_len=2048, max_num_seqs=4, kv_cache_bytes=256 << 20, **fields)


def run(engine: LLMEngine, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy tokens and the cached-token count the request reports."""
    rid = f"r{next(_ids)}"
    engine.add_request(rid, prompt, GREEDY)
    tokens: list[int] = []
    cached = -1
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
            if out.finished:
                cached = out.num_cached_tokens
    engine.scheduler.check_integrity()
    return tokens, cached


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("kv-disk"))


@pytest.fixture(scope="module")
def engine(disk_dir) -> LLMEngine:
    """Prefix cache on, a host tier and a disk tier; the first request (the prefix) already run."""
    return LLMEngine(config(kv_host_gb=0.5, kv_disk_gb=0.5, kv_disk_dir=disk_dir))


@pytest.fixture(scope="module")
def shared(engine: LLMEngine) -> tuple[list[int], list[int]]:
    """(first prompt, second prompt): 1,500 shared tokens, then each its own question."""
    ids = engine.tokenizer.encode(TEXT * 60)
    prefix = [2, *ids[: PREFIX_TOKENS - 1]]  # BOS first, as the model expects
    first = prefix + engine.tokenizer.encode(" Where does the river rise?")
    second = prefix + engine.tokenizer.encode(" What do the farmers grow in the fields by the river?")
    run(engine, first)
    return first, second


@pytest.fixture(scope="module")
def reference(shared: tuple[list[int], list[int]]) -> list[int]:
    """The second prompt's greedy tokens with no prefix reuse at all."""
    off = LLMEngine(config(enable_prefix_caching=False))
    assert off.kv.prefix_cache is None and off.kv.tiers is None
    tokens, cached = run(off, shared[1])
    assert cached == 0
    return tokens


def hits(engine: LLMEngine, tier: str) -> int:
    assert engine.kv.tiers is not None
    return engine.kv.tiers.stats.hit_blocks[tier]


def test_second_request_reuses_the_prefix_from_the_device(engine, shared, reference) -> None:
    before = (hits(engine, "host"), hits(engine, "disk"))
    tokens, cached = run(engine, shared[1])
    assert cached >= 1400
    assert (hits(engine, "host"), hits(engine, "disk")) == before  # all from the tree
    assert tokens == reference


def test_after_eviction_to_host_ram(engine, shared, reference) -> None:
    assert engine.kv.reset_prefix_cache() >= PREFIX_TOKENS // engine.block_size  # all of it goes down a tier
    before = hits(engine, "host")
    tokens, cached = run(engine, shared[1])
    assert cached >= 1400
    assert (hits(engine, "host") - before) * engine.block_size >= 1400
    assert tokens == reference


def test_after_eviction_to_disk(engine, shared, reference) -> None:
    engine.kv.reset_prefix_cache()
    assert engine.kv.tiers.flush_host_to_disk() >= 1400 // engine.block_size
    before = hits(engine, "disk")
    tokens, cached = run(engine, shared[1])
    assert cached >= 1400
    assert (hits(engine, "disk") - before) * engine.block_size >= 1400
    assert tokens == reference


def test_after_a_restart_from_disk(engine, shared, reference, disk_dir) -> None:
    engine.persist_prefix_cache()  # what AsyncEngine does when it stops
    assert engine.kv.num_cached_blocks == 0 and len(engine.kv.tiers.host) == 0
    restarted = LLMEngine(config(kv_host_gb=0.5, kv_disk_gb=0.5, kv_disk_dir=disk_dir))
    assert len(restarted.kv.tiers.disk) >= 1400 // restarted.block_size  # the index rebuilt from the folder
    tokens, cached = run(restarted, shared[1])
    assert cached >= 1400
    assert hits(restarted, "disk") * restarted.block_size >= 1400 and hits(restarted, "host") == 0
    assert tokens == reference



def test_stopping_background_work_stops_the_host_tier_pinning_thread(monkeypatch) -> None:
    """AsyncEngine's stop ends with stop_background_work: the host tier stops making its chunks ahead of
    need (cache/host_chunks.py), and the engine keeps serving."""
    from app.engine.cache.host_chunks import HostChunks

    closed: list[HostChunks] = []
    close = HostChunks.close
    monkeypatch.setattr(HostChunks, "close", lambda self: closed.append(self) or close(self))
    engine = LLMEngine(config(kv_host_gb=4.0))
    host = engine.kv.tiers.host
    engine.stop_background_work()
    assert len(closed) == 1 and not host.making_ahead  # the KV host tier's (a dense model: no state rows)
    tokens, _ = run(engine, list(range(1, 40)))
    assert len(tokens) == GREEDY.max_tokens
