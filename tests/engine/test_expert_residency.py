"""The expert residency manager (moe/residency.py), against a model of the device slots.

The test keeps its own picture of what each device slot holds, changed only by the copies the
manager asks for, and checks every round against it: each expert a round runs is in the slot the
round names, no slot serves two experts of a round, a round fetches only its own experts and each
once, and the bytes counted are the fetched experts' sizes. Hypothesis drives
random routings, hot-set sizes, staging sizes and rebalancing periods.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.moe.residency import ExpertStreaming, LayerResidency

EXPERT_BYTES = 1000


@st.composite
def scenarios(draw):
    experts = draw(st.integers(1, 12))
    hot = draw(st.integers(0, experts))
    staging = draw(st.integers(1, 5))
    every = draw(st.sampled_from([0, 1, 3]))
    k = draw(st.integers(1, experts))
    steps = draw(
        st.lists(
            st.lists(st.lists(st.integers(0, experts - 1), min_size=k, max_size=k, unique=True), min_size=1, max_size=6),
            min_size=1,
            max_size=12,
        )
    )
    return experts, hot, staging, every, steps


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_round_finds_its_experts_in_their_slots(scenario):
    experts, hot, staging, every, steps = scenario
    layer = LayerResidency(experts, hot, staging, EXPERT_BYTES, rebalance_every=every)
    slots: dict[int, int] = {s: s for s in range(hot)}  # the device as the test sees it: slot -> expert
    fetched = 0
    for chosen in steps:
        picks = np.array(chosen)
        rounds = layer.step(picks)
        seen: list[int] = []
        for round_ in rounds:
            for copy in round_.copies:
                assert 0 <= copy.slot < layer.num_slots
                slots[copy.slot] = copy.expert
                fetched += EXPERT_BYTES
            assert len(set(round_.slots)) == len(round_.slots), "a slot booked twice in one round"
            for expert, slot in zip(round_.experts, round_.slots, strict=True):
                assert slots.get(slot) == expert, f"expert {expert} is not in slot {slot}"
            staged = [c.expert for c in round_.copies if c.slot >= layer.hot_slots]
            assert len(set(staged)) == len(staged) and set(staged) <= set(round_.experts)
            cold = [e for e, s in zip(round_.experts, round_.slots, strict=True) if s >= layer.hot_slots]
            assert len(cold) <= layer.staging_slots
            seen += round_.experts
        assert seen == sorted(set(picks.reshape(-1).tolist())), "every picked expert runs once, in id order"
        layer.check_integrity()
    assert layer.bytes_copied == fetched == layer.copies * EXPERT_BYTES


def test_all_resident_copies_nothing():
    layer = LayerResidency(6, 6, 0, EXPERT_BYTES)
    (only,) = layer.step(np.array([[5, 1], [2, 1]]))
    assert only.experts == (1, 2, 5) and only.slots == (1, 2, 5) and only.copies == ()
    assert layer.bytes_copied == 0


def test_staging_keeps_the_last_picks_and_evicts_the_least_recent():
    layer = LayerResidency(8, 2, 2, EXPERT_BYTES, rebalance_every=0)
    (first,) = layer.step(np.array([0, 5]))  # 0 is hot; 5 goes into the first staging slot
    assert [(c.expert, c.slot) for c in first.copies] == [(5, 2)]
    (again,) = layer.step(np.array([5, 6]))  # 5 is a hit; 6 takes the free slot
    assert [(c.expert, c.slot) for c in again.copies] == [(6, 3)]
    (third,) = layer.step(np.array([6, 7]))  # 5 is least recently used: 7 replaces it
    assert [(c.expert, c.slot) for c in third.copies] == [(7, 2)]
    assert layer.bytes_copied == 3 * EXPERT_BYTES


def test_a_batch_needing_more_cold_experts_than_slots_runs_in_rounds():
    layer = LayerResidency(8, 1, 2, EXPERT_BYTES, rebalance_every=0)
    rounds = layer.step(np.array([[0, 3], [4, 6], [7, 3]]))
    assert [r.experts for r in rounds] == [(0, 3, 4), (6, 7)]
    assert sum(len(r.copies) for r in rounds) == 4


def test_rebalancing_promotes_the_most_picked_experts():
    layer = LayerResidency(6, 2, 2, EXPERT_BYTES, rebalance_every=3)
    for _ in range(2):
        layer.step(np.array([4, 5]))
    assert layer.hot_set == [0, 1]
    rounds = layer.step(np.array([4, 5]))  # the third step re-chooses the hot set first
    assert sorted(layer.hot_set) == [4, 5]
    assert [c.slot for c in rounds[0].copies] == [0, 1] and rounds[0].slots == (0, 1)
    layer.check_integrity()


def test_streaming_config_sizes_each_layer_and_refuses_too_many():
    streaming = ExpertStreaming(on_gpu=4)
    layer = streaming.layer(num_experts=6, num_used=4, expert_bytes=10)
    assert (layer.hot_slots, layer.staging_slots) == (4, 2)  # k = 4 capped by the 2 cold experts
    layer.step(np.array([0, 1, 4, 5]))
    assert streaming.bytes_copied == 20
    with pytest.raises(ValueError, match="more than the model's 6 experts"):
        ExpertStreaming(on_gpu=7).layer(6, 2, 10)
