"""BlockTable: the int32 copy a request's block table keeps must equal the list after any change,
whether the table grows at its end (the copy is updated incrementally) or changes otherwise (the
copy is rebuilt). Checked under random operations (hypothesis) and through the KV cache manager
and scheduler, which grow, share, preempt and free tables."""

from __future__ import annotations

import copy
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cache.block_table import BlockTable, block_table_array
from app.engine.cache.manager import KVCacheManager
from app.engine.core.scheduler import Scheduler, SchedulerConfig
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams


def assert_mirrors(table: BlockTable) -> None:
    assert table.array.dtype == np.int32
    assert table.array.tolist() == list(table)


ids = st.integers(min_value=1, max_value=10_000)
operations = st.one_of(
    st.tuples(st.just("append"), ids),
    st.tuples(st.just("extend"), st.lists(ids, max_size=40)),
    st.tuples(st.just("iadd"), st.lists(ids, max_size=5)),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("setitem"), ids),
    st.tuples(st.just("delslice"), st.integers(0, 5)),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("insert"), ids),
    st.tuples(st.just("reverse"), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ids, max_size=30), st.lists(operations, max_size=40))
def test_copy_equals_list_after_any_operations(start: list[int], ops: list[tuple[str, object]]) -> None:
    table, reference = BlockTable(start), list(start)
    assert_mirrors(table)
    for name, arg in ops:
        for target in (table, reference):
            if name == "append":
                target.append(arg)
            elif name == "extend":
                target.extend(iter(arg))  # an iterator: consumed once, as extend allows
            elif name == "iadd":
                target += arg
            elif name == "clear":
                target.clear()
            elif name == "setitem" and target:
                target[len(target) // 2] = arg
            elif name == "delslice":
                del target[: int(arg)]
            elif name == "pop" and target:
                target.pop()
            elif name == "insert":
                target.insert(1, arg)
            elif name == "reverse":
                target.reverse()
        assert table == reference and type(table) is BlockTable
        assert_mirrors(table)


def test_copies_and_pickles_keep_the_table() -> None:
    table = BlockTable(range(1, 40))
    for twin in (copy.copy(table), copy.deepcopy(table), pickle.loads(pickle.dumps(table))):
        assert type(twin) is BlockTable and twin == table and twin is not table
        assert_mirrors(twin)
        twin.append(99)
        assert 99 not in table


def test_block_table_array_of_a_plain_list() -> None:
    assert block_table_array([3, 1, 2]).tolist() == [3, 1, 2]
    assert block_table_array([3, 1, 2]).dtype == np.int32


def test_request_field_is_always_a_table() -> None:
    params = SamplingParams()
    a, b = Request("a", [1, 2], params), Request("b", [1, 2], params, block_ids=[5, 6])
    assert type(a.block_ids) is BlockTable and a.block_ids == []
    assert type(b.block_ids) is BlockTable and b.block_ids.array.tolist() == [5, 6]
    a.block_ids.append(7)
    assert Request("c", [1], params).block_ids == []  # the default is not shared
    a.block_ids = range(3, 6)
    assert type(a.block_ids) is BlockTable and a.block_ids.array.tolist() == [3, 4, 5]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_tables_mirror_through_scheduling_preemption_and_prefix_hits(data: st.DataObject) -> None:
    """Random prompts (sharing prefixes, so tables start with cached blocks) in a cache small enough
    to preempt: after every step every request's copy equals its list."""
    bs = 4
    kv = KVCacheManager(num_blocks=24, block_size=bs)
    scheduler = Scheduler(SchedulerConfig(4, 16, 64, bs), kv)
    base = data.draw(st.lists(st.integers(1, 50), min_size=8, max_size=24))
    requests = []
    for i in range(data.draw(st.integers(1, 6))):
        cut = data.draw(st.integers(1, len(base)))
        tail = data.draw(st.lists(st.integers(1, 50), max_size=12))
        request = Request(
            f"r{i}", base[:cut] + tail, SamplingParams(max_tokens=data.draw(st.integers(1, 12)))
        )
        scheduler.add(request)
        requests.append(request)
    for _ in range(200):
        if not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        for request in requests:
            assert_mirrors(request.block_ids)
        sampled = {c.request.request_id: data.draw(st.integers(1, 50)) for c in out.chunks if c.samples}
        scheduler.update(out, sampled)
        for chunk in out.chunks:
            request = chunk.request
            if (
                request.status == RequestStatus.RUNNING
                and request.num_output_tokens >= request.sampling_params.max_tokens
            ):
                scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
        scheduler.check_integrity()
        for request in requests:
            assert_mirrors(request.block_ids)
    assert not scheduler.has_unfinished()
