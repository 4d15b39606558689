"""A hybrid model's recurrent-state cache, per request: its slot, and the prefix-cache snapshots.

Integers only (cache/state_slots.py names the rows). A recurrent layer keeps one fixed-size state
per sequence instead of a KV entry per token, so a prefix hit can only resume where a copy of the
state at that exact token count was kept: a snapshot. The policy:

- A running request holds one slot (its live state) from admission to finish, abort or preemption.
- On admission, the prefix match is the longest prefix whose KV blocks are cached AND whose state
  snapshot exists (`resume`); the snapshot is copied into the request's slot before the step runs
  (a restore), and the chunk continues from it.
- Snapshots are taken at the end of a step (a save: slot -> snapshot row, after the forward) where
  a chunk ends on a block boundary. Prefill chunks are cut (`chunk_tokens`) to span at most
  `interval` tokens and to end at the prompt's last block boundary, so a second request sharing a long
  system prompt resumes within `interval` tokens of where they differ, and the next turn of a
  conversation resumes at the end of the previous one; those snapshots are published after the
  step. A decoding request keeps overwriting one held row at each block boundary it passes; when
  it ends that row is published (the last block boundary of prompt + output: an agent's next turn).
  A boundary the request is sure to pass another after (`min_tokens` keeps it going) copies nothing:
  only the last save would survive (with `paddock bench`'s min_tokens = max_tokens = 128 and 16-token
  blocks, one ~150 MB Qwen3.5-27B copy per request instead of eight). The row is taken at the boundary
  before the last one (held, nothing saved: `end` 0), not at the first: published snapshots are
  evicted later, and the spill of the one it evicts has a block of decode steps to finish before the
  save overwrites the row (a whole batch reaching its last boundary together would otherwise wait
  for ~5 GB over PCIe in that step).
- Snapshot rows are bounded (`SnapshotRows`, sized by bytes in the memory plan) and evicted least
  recently used first; a restore and a save of the same step never race (restores run before the
  forward, saves after it).
- Speculative decoding (`checkpoints`): a verify chunk runs the last token and k drafts through the
  recurrent layers, which leaves the state after all k+1 of them. Each slot has a checkpoint row;
  the slot is copied there before a verify chunk's forward (`plan_verify`), and where drafts were
  rejected the slot is restored from it before the next forward (`rollback`) and the request
  recomputes the tokens it kept from there (the scheduler does not advance it), with new drafts after
  them: the state is then the one the kept tokens alone leave, at the cost of one recompute of them
  per rejection. A save
  the verify chunk planned (it ended on a block boundary) holds rejected tokens' state: it is
  dropped. Checkpoint rows are `num_slots` more rows after the snapshots; a slot's row is only
  written and read by the request holding the slot, between a verify step and the next.
- With a host-RAM tier (`host_rows`), a snapshot evicted from the device is spilled there (a
  device row -> host row copy before the forward of the step whose save reuses the row), and a
  prefix hit may load its snapshot from there straight into the request's slot. Before the
  forward the runner does loads, then restores, then spills: a load reads its host row before a
  spill of the same step reuses it, and a key spilled in this step is not loaded until the next.

Keys: a chain hash per block of the cache tokens (`Request.cache_token_prefix`), seeded by the
prefix cache's namespace, so a key names the whole prefix up to a block boundary.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from app.engine.cache.state_slots import NULL_ROW, SnapshotRows, StateSlots
from app.engine.request import Request


@dataclass
class StateCopies:
    """One step's recurrent-state row copies, (source, destination) each. Before the forward, in
    this order: loads (host row -> slot), restores (snapshot or checkpoint row -> slot), checkpoints
    (slot -> its checkpoint row, before a verify chunk), spills (snapshot row -> host row); after it:
    saves (slot -> snapshot row)."""

    restores: list[tuple[int, int]] = field(default_factory=list)
    saves: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)
    spills: list[tuple[int, int]] = field(default_factory=list)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.restores or self.saves or self.loads or self.spills or self.checkpoints)


class StateCache:
    def __init__(
        self,
        num_slots: int,
        num_snapshots: int,
        block_size: int,
        interval: int = 0,
        extra_key: Hashable = None,
        host_rows: int = 0,
        checkpoints: bool = False,
    ) -> None:
        self.block_size = block_size
        self.slots = StateSlots(num_slots)
        self.host = SnapshotRows(0, host_rows) if host_rows else None  # rows of the host-RAM tier
        self.snapshots = SnapshotRows(num_slots + 1, num_snapshots, self._spill if self.host else None)
        self.num_rows = 1 + num_slots + num_snapshots  # with the null row 0
        self._first_checkpoint = self.num_rows if checkpoints else 0  # slot s -> row first + s - 1
        self.num_rows += num_slots if checkpoints else 0
        self.interval = -(-interval // block_size) * block_size if interval > 0 else 0  # whole blocks
        self.extra_key = extra_key
        self._slot_of: dict[str, int] = {}  # request id -> its live slot
        self._restores: dict[int, int] = {}  # slot -> snapshot row, copied before the next forward
        self._saves: dict[int, int] = {}  # slot -> snapshot row, copied after the next forward
        self._planned: dict[str, tuple[int, int]] = {}  # request id -> (row, end): published after the step
        self._held: dict[str, tuple[int, int]] = {}  # request id -> (row, end): published when it ends
        self._keys: dict[str, list[int]] = {}  # request id -> chain key per block, computed so far
        self._loads: dict[int, int] = {}  # slot -> host row, copied before the next forward
        self._spills: dict[int, int] = {}  # host row -> device row, copied before the next forward
        self._checkpoints: dict[int, int] = {}  # slot -> its checkpoint row, copied before the next forward
        self.restored_tokens = 0  # tokens resumed from snapshots, since start
        self.host_hits = 0  # prefix hits resumed from the host tier, since start

    # --- slots ---

    def can_admit(self) -> bool:
        return self.slots.can_allocate()

    def slot(self, request: Request) -> int:
        """The request's live slot, allocated on first use (admission)."""
        slot = self._slot_of.get(request.request_id)
        if slot is None:
            slot = self._slot_of[request.request_id] = self.slots.allocate()
        request.state_slot = slot
        return slot

    def release(self, request: Request) -> None:
        """The request gives up its slot (finish, abort, preemption, failed admission): its held
        decode snapshot is published if the state there is known to be computed; pending copies go."""
        rid = request.request_id
        slot = self._slot_of.pop(rid, None)
        unsaved = slot is not None and slot in self._saves  # its save of this step will not run
        if slot is not None:
            self._restores.pop(slot, None)
            self._saves.pop(slot, None)
            self._loads.pop(slot, None)
            self._checkpoints.pop(slot, None)
            self.slots.free(slot)
        request.state_slot = None
        planned = self._planned.pop(rid, None)
        if planned is not None:
            self.snapshots.release(planned[0])
        held = self._held.pop(rid, None)
        if held is not None:
            row, end = held
            if 0 < end <= request.num_computed_tokens and not unsaved:  # end 0: taken, never saved into
                self.snapshots.publish(row, self._key(request, end))
            else:  # the save past num_computed_tokens ran ahead of the stop (async decode), or never ran
                self.snapshots.release(row)
        self._keys.pop(rid, None)

    # --- prefix hits ---

    def resume(self, request: Request, tokens: Sequence[int], max_blocks: int) -> int:
        """The most blocks k <= max_blocks of `tokens` whose state snapshot exists; the request's
        slot is restored from it before the next step (0: none, the request starts from zero)."""
        keys = self._chain(request, tokens, max_blocks)
        for k in range(max_blocks, 0, -1):
            key = keys[k - 1]
            if self.snapshots.contains(key):
                row = self.snapshots.lookup(key)
                assert row is not None
                self._restores[self.slot(request)] = row
            elif self.host is not None and self.host.contains(key) and not self._spilling(key):
                row = self.host.lookup(key)
                assert row is not None
                self._loads[self.slot(request)] = row
                self.host_hits += 1
            else:
                continue
            self.restored_tokens += k * self.block_size
            return k
        return 0

    # --- snapshot points ---

    def chunk_tokens(self, request: Request, start: int, num_tokens: int) -> int:
        """`num_tokens`, cut so that a prefill chunk from `start` ends at its first snapshot point:
        `interval` tokens past its start's block boundary, the last block boundary of the known
        tokens, or (for a chunk the budget cut short) the block boundary before its end. Decodes are
        never cut.

        A cut costs a step: a request runs one chunk a step (the state is only copied out after the
        forward), so a point inside a chunk the budget allows ends the request's work for the step.
        Snapshot points are therefore spaced, not placed: every chunk that ends on a block boundary is
        saved (`plan_save`), so chunks of at most `interval` tokens keep a prefix hit within `interval`
        of where two prompts differ, whatever the positions. Multiples of `interval` (as before) cut a
        lone 8,000-token prompt on Qwen3.5-27B (interval ~2,400, budget 2,048) into seven steps
        (2,048, 352, 2,048, 352, 2,048, 352, 800) where a dense model takes four; spaced, it takes four
        too. The cut at the prompt's last block boundary stays (an agent's next turn, a regenerated
        reply or a preempted request resumes there): a prompt of n blocks plus a few tokens takes two
        steps, and the scheduler runs those tails first in the next step (`Scheduler.schedule`)."""
        if not self.snapshots.num_rows or num_tokens < 2:
            return num_tokens
        bs, end, total = self.block_size, start + num_tokens, request.num_tokens
        points = [total // bs * bs]
        if self.interval:  # `interval` past the last block boundary at or before `start` (a snapshot point
            points.append(start // bs * bs + self.interval)  # when a chunk ended there), not its multiples
        if end < total:
            points.append(end // bs * bs)
        inside = [p for p in points if start < p < end]
        return min(inside) - start if inside else num_tokens

    def plan_save(self, request: Request, start: int, num_tokens: int, samples: bool) -> None:
        """A chunk was scheduled: if it ends on a block boundary, its state there is copied to a
        snapshot row after the step (prefill: published then; decode: held until the request ends)."""
        end = start + num_tokens
        if not self.snapshots.num_rows or end % self.block_size:
            return
        slot, rid = self.slot(request), request.request_id
        if samples and start >= request.num_prompt_tokens:  # a decode: one held row, overwritten
            surely = _surely_computed(request)
            skip = end + self.block_size <= surely  # a later boundary's save would overwrite this one
            if skip and end + 2 * self.block_size <= surely:
                return  # no copy, no row held meanwhile
            held = self._held.get(rid)
            if held is None:
                if len(self._held) >= self.snapshots.num_rows // 2:
                    return  # held rows would crowd out the published ones
                row = self.snapshots.reserve()
                if row is None:
                    return
            else:
                row = held[0]
            if skip:  # the boundary before the last: the row is taken now, nothing copied into it yet, so
                self._held[rid] = (row, 0)  # the spill of a snapshot it evicts runs beside the steps between
                return
            self._held[rid] = (row, end)
        else:
            if rid in self._planned:
                return
            row = self.snapshots.reserve()
            if row is None:
                return
            self._planned[rid] = (row, end)
        self._saves[slot] = row

    def step_done(self, request: Request) -> None:
        """The request's chunk of the step was recorded (its state is computed up to
        `num_computed_tokens`): publish the prefill snapshot planned for it."""
        planned = self._planned.pop(request.request_id, None)
        if planned is None:
            return
        row, end = planned
        if end == request.num_computed_tokens:
            self.snapshots.publish(row, self._key(request, end))
        else:
            self.snapshots.release(row)

    # --- speculative decoding ---

    def checkpoint_row(self, slot: int) -> int:
        if not self._first_checkpoint:
            raise ValueError("this state cache keeps no checkpoints: speculative decoding was off when it was built")
        return self._first_checkpoint + slot - 1

    def plan_verify(self, request: Request) -> None:
        """A verify chunk was scheduled: its slot is copied to its checkpoint row before the forward."""
        slot = self.slot(request)
        self._checkpoints[slot] = self.checkpoint_row(slot)

    def rollback(self, request: Request) -> None:
        """The request's verify chunk kept fewer tokens than it ran: its slot goes back to the checkpoint
        before the next forward (the request recomputes the kept tokens from there), and a decode save
        the chunk planned past what it keeps is dropped."""
        slot = self.slot(request)
        self._restores[slot] = self.checkpoint_row(slot)
        held = self._held.get(request.request_id)
        if held is not None and held[1] > request.num_computed_tokens:
            del self._held[request.request_id]
            self.snapshots.release(held[0])

    # --- the step's copies ---

    def take_copies(self) -> StateCopies:
        """The state copies of the step just scheduled, each (source row, destination row)."""
        copies = StateCopies(
            restores=[(row, slot) for slot, row in self._restores.items()],
            saves=[(slot, row) for slot, row in self._saves.items()],
            loads=[(host_row, slot) for slot, host_row in self._loads.items()],
            spills=[(row, host_row) for host_row, row in self._spills.items()],
            checkpoints=list(self._checkpoints.items()),
        )
        self._checkpoints.clear()
        self._restores.clear()
        self._saves.clear()
        self._loads.clear()
        self._spills.clear()
        return copies

    def reset(self) -> int:
        """Drop every published snapshot; return how many."""
        return self.snapshots.clear()

    def check_integrity(self) -> None:
        self.slots.check_integrity()
        self.snapshots.check_integrity()
        if self.host is not None:
            self.host.check_integrity()
        assert NULL_ROW not in self._slot_of.values()
        assert len(set(self._slot_of.values())) == len(self._slot_of), "two requests share a state slot"

    # --- internals ---

    def _spill(self, key: Hashable, row: int) -> None:
        """A published device snapshot is evicted: keep it in the host tier (copied before the
        forward of this step, whose save then overwrites the device row)."""
        assert self.host is not None
        host_row = self.host.reserve()
        if host_row is None:
            return
        self.host.publish(host_row, key)
        self._spills[host_row] = row

    def _spilling(self, key: Hashable) -> bool:
        """Whether `key`'s host copy is only planned (its spill runs with this step's copies)."""
        assert self.host is not None
        row = self.host.lookup_quiet(key)
        return row in self._spills

    def _key(self, request: Request, end: int) -> int:
        return self._chain(request, request.cache_token_prefix(end), end // self.block_size)[-1]

    def _chain(self, request: Request, tokens: Sequence[int], num_blocks: int) -> list[int]:
        """Chain keys of the first `num_blocks` blocks of `tokens` (the request's cache tokens),
        extending the request's cached list: each prefix is hashed once per request."""
        keys = self._keys.setdefault(request.request_id, [])
        bs = self.block_size
        key = keys[-1] if keys else hash(("state", self.extra_key))
        for k in range(len(keys), num_blocks):
            key = hash((key, tuple(tokens[k * bs : (k + 1) * bs])))
            keys.append(key)
        return keys[:num_blocks]


def _surely_computed(request: Request) -> int:
    """Tokens the request's state will certainly reach before it ends (0: unknown): with `min_tokens` it can
    stop no sooner than min(min_tokens, max_tokens) outputs, and its last sampled token is never computed.
    Only an abort or a preemption ends it sooner, and then it resumes from an earlier snapshot."""
    params = request.sampling_params
    if not params.min_tokens or params.max_tokens is None:
        return 0
    return request.num_prompt_tokens + min(params.min_tokens, params.max_tokens) - 1
