"""Which of a MoE layer's experts are in device slots, and which to copy in for a step: ints only.

A layer whose experts do not all fit on the GPU gets a fixed number of device slots: N hot slots
holding the hot set (`--experts-on-gpu N`) and S staging slots (default: k, one step's picks at
c=1). Every expert stays in pinned host RAM. Per step the backend hands `step()` the router's
chosen expert ids; it answers with rounds, each a run of experts in ascending id order with the
slot each is in and the copies (expert -> staging slot) that must land before the round runs.
A round holds at most S cold experts, so a batch whose picks need more cold experts than there are
staging slots runs in several rounds; at decode with S >= k there is one. Staging slots are
evicted least recently used first, never one that the same round needs, so an expert that
several consecutive tokens pick is copied once. The hot set starts as experts 0..N-1 and is
re-chosen every `rebalance_every` steps as the N experts the router picked most so far (ties to
the lower id); the promoted experts are copied into the hot slots the demoted ones leave.

Why this design:
- The router's choices reach the host (one small device-to-host copy of `[T, k]` ids per MoE
  layer and step) so that only the cold experts actually picked cross PCIe. Streaming every cold
  expert instead would keep the step free of host syncs (decode graphs could stay on) but moves
  (E - N) experts per layer and step instead of at most min(T k, E - N): for GPT-OSS-20B at c=1
  (32 experts, k = 4, N = 0) that is 8x the bytes, and the copies, not the sync, bound the step.
  So a model with streamed experts runs without decode CUDA graphs (the MoE layer reports
  `syncs_host`), as the per-expert fallback does.
- Slots per layer, not one staging pool shared by the layers: the LRU keeps last step's cold
  picks of each layer, which consecutive tokens often pick again, at the price of S slots per
  layer (plan/expert_plan.py counts them).
- Rounds in ascending expert order let the numpy backend add a token's expert outputs in the same
  order as with every expert resident, so it gives exactly the same tokens (the oracle); the
  CUDA backend adds the rounds' partial sums, equal up to float32 rounding.
- Pure Python over ids, so it is tested without a device (tests/engine/test_expert_residency.py),
  and it can check its own integrity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

DEFAULT_REBALANCE_STEPS = 256


@dataclass(frozen=True)
class Copy:
    """Copy `expert`'s weights from host RAM into device slot `slot`."""

    expert: int
    slot: int


@dataclass(frozen=True)
class Round:
    """Experts (ascending) to run together, each in `slots[i]`, once `copies` have landed."""

    experts: tuple[int, ...]
    slots: tuple[int, ...]
    copies: tuple[Copy, ...]


class LayerResidency:
    """One MoE layer's device slots: `hot_slots` for the hot set, then `staging_slots` for cold picks."""

    def __init__(
        self,
        num_experts: int,
        hot_slots: int,
        staging_slots: int,
        expert_bytes: int,
        rebalance_every: int = DEFAULT_REBALANCE_STEPS,
    ) -> None:
        if not 0 <= hot_slots <= num_experts:
            raise ValueError(f"{hot_slots} hot slots for {num_experts} experts")
        if hot_slots < num_experts and staging_slots < 1:
            raise ValueError("experts off the device need at least one staging slot")
        self.num_experts, self.hot_slots = num_experts, hot_slots
        self.staging_slots = staging_slots if hot_slots < num_experts else 0
        self.expert_bytes, self.rebalance_every = expert_bytes, rebalance_every
        self.slot_of = np.full(num_experts, -1, np.int64)  # the slot an expert is in, or -1
        self.expert_in = [-1] * self.num_slots  # the expert a slot holds, or -1
        for slot in range(hot_slots):
            self._place(slot, slot)
        self._lru: OrderedDict[int, None] = OrderedDict((s, None) for s in range(hot_slots, self.num_slots))
        self.uses = np.zeros(num_experts, np.int64)  # how often the router picked each expert
        self.steps = 0
        self.bytes_copied = 0
        self.copies = 0

    @property
    def num_slots(self) -> int:
        return self.hot_slots + self.staging_slots

    @property
    def hot_set(self) -> list[int]:
        return self.expert_in[: self.hot_slots]

    def step(self, chosen: np.ndarray) -> list[Round]:
        """The rounds that run this step's picks (`chosen`: the router's expert ids, any shape)."""
        ids = np.asarray(chosen, np.int64).reshape(-1)
        self.steps += 1
        self.uses += np.bincount(ids, minlength=self.num_experts)
        promoted: tuple[Copy, ...] = ()
        if self.rebalance_every and self.steps % self.rebalance_every == 0:
            promoted = self.rebalance()
        rounds = self.plan(np.unique(ids).tolist())
        if promoted:
            first = rounds[0] if rounds else Round((), (), ())
            rounds[:1] = [Round(first.experts, first.slots, promoted + first.copies)]
        return rounds

    def plan(self, needed: Iterable[int]) -> list[Round]:
        """Rounds over `needed` (ascending), each with at most `staging_slots` cold experts, staged."""
        rounds: list[Round] = []
        current: list[int] = []
        cold = 0
        for expert in sorted(set(needed)):
            is_cold = not self._is_hot(expert)
            if is_cold and cold == self.staging_slots:
                rounds.append(self._staged(current))
                current, cold = [], 0
            current.append(expert)
            cold += is_cold
        if current:
            rounds.append(self._staged(current))
        return rounds

    def rebalance(self) -> tuple[Copy, ...]:
        """Make the hot set the experts picked most so far; the copies that move them in."""
        wanted = np.argsort(-self.uses, kind="stable")[: self.hot_slots].tolist()
        arriving = [e for e in wanted if not self._is_hot(e)]
        leaving = [s for s in range(self.hot_slots) if self.expert_in[s] not in wanted]
        copies = []
        for expert, slot in zip(arriving, leaving, strict=True):
            staged = int(self.slot_of[expert])
            if staged >= 0:  # leave its staging slot free, least recently used
                self.expert_in[staged] = -1
                self._lru.move_to_end(staged, last=False)
            self.slot_of[self.expert_in[slot]] = -1
            self._place(expert, slot)
            copies.append(Copy(expert, slot))
        self._count(len(copies))
        return tuple(copies)

    def check_integrity(self) -> None:
        """Slots and experts map one to one, hot slots hold the hot set, the LRU lists the staging slots."""
        for slot, expert in enumerate(self.expert_in):
            assert expert == -1 or self.slot_of[expert] == slot, f"slot {slot} holds {expert} twice-booked"
        for expert, slot in enumerate(self.slot_of.tolist()):
            assert slot == -1 or self.expert_in[slot] == expert, f"expert {expert} points at slot {slot}"
        assert all(e >= 0 for e in self.hot_set), "a hot slot is empty"
        assert sorted(self._lru) == list(range(self.hot_slots, self.num_slots))

    # -- internals ---------------------------------------------------------------------------

    def _is_hot(self, expert: int) -> bool:
        return 0 <= self.slot_of[expert] < self.hot_slots

    def _staged(self, experts: list[int]) -> Round:
        """Bring the round's cold experts into staging slots (hits first touched, then misses copied)."""
        cold = [e for e in experts if not self._is_hot(e)]
        for expert in cold:
            if self.slot_of[expert] >= 0:
                self._lru.move_to_end(int(self.slot_of[expert]))
        copies = []
        needed = set(cold)
        for expert in cold:
            if self.slot_of[expert] >= 0:
                continue
            slot = next(s for s in self._lru if self.expert_in[s] not in needed)
            if self.expert_in[slot] >= 0:
                self.slot_of[self.expert_in[slot]] = -1
            self._place(expert, slot)
            self._lru.move_to_end(slot)
            copies.append(Copy(expert, slot))
        self._count(len(copies))
        return Round(tuple(experts), tuple(int(self.slot_of[e]) for e in experts), tuple(copies))

    def _place(self, expert: int, slot: int) -> None:
        self.slot_of[expert] = slot
        self.expert_in[slot] = expert

    def _count(self, copies: int) -> None:
        self.copies += copies
        self.bytes_copied += copies * self.expert_bytes


@dataclass
class ExpertStreaming:
    """What the engine asks of a backend's MoE layers: N experts per layer on the device, the rest
    streamed; the backend makes one `LayerResidency` per layer and the engine reads the counters."""

    on_gpu: int
    staging_slots: int | None = None  # per layer; None: k (at most the cold experts)
    rebalance_every: int = DEFAULT_REBALANCE_STEPS
    layers: list[LayerResidency] = field(default_factory=list)

    def layer(self, num_experts: int, num_used: int, expert_bytes: int) -> LayerResidency:
        if self.on_gpu > num_experts:
            raise ValueError(f"--experts-on-gpu {self.on_gpu} is more than the model's {num_experts} experts per layer")
        staging = self.staging_slots or num_used
        residency = LayerResidency(
            num_experts, self.on_gpu, min(staging, num_experts - self.on_gpu), expert_bytes, self.rebalance_every
        )
        self.layers.append(residency)
        return residency

    @property
    def bytes_copied(self) -> int:
        return sum(layer.bytes_copied for layer in self.layers)
