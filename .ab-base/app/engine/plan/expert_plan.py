"""Where a mixture of experts' experts live: the hot set on the GPU, the rest in pinned host RAM.

`--experts-on-gpu N` keeps N experts of every layer resident on the GPU; the other E - N stay in
pinned host memory and the ones a step's tokens pick are copied in over PCIe into each layer's
staging slots (k of them, least recently used evicted first: moe/residency.py says how
and why), overlapped with the products of the layer's hot experts. "auto" takes the largest N
whose resident experts and staging fit the budget left after everything else; "all" (the
default) keeps every expert on the GPU, as for a dense model.

PCIe traffic per decoded token is estimated for uniform routing: each of a layer's k picks is cold
with probability (E - N) / E, so a token moves layers x k x (E - N) / E experts' bytes. A batch
shares the copies of experts several of its tokens picked, so this is the c=1 figure and an upper
bound per token for larger batches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertPlan:
    num_layers: int
    num_experts: int  # per layer
    experts_used: int  # per token, per layer (k)
    bytes_per_expert: int  # one expert of one layer: its gate, up and down projections
    on_gpu: int  # per layer: the resident hot set

    @property
    def all_on_gpu(self) -> bool:
        return self.on_gpu >= self.num_experts

    @property
    def gpu_bytes(self) -> int:
        return self.num_layers * self.on_gpu * self.bytes_per_expert

    @property
    def host_bytes(self) -> int:
        return self.num_layers * (self.num_experts - self.on_gpu) * self.bytes_per_expert

    @property
    def staging_slots(self) -> int:
        """Per layer: the device slots cold experts are copied into, one step's k picks at c=1."""
        return 0 if self.all_on_gpu else min(self.experts_used, self.num_experts - self.on_gpu)

    @property
    def staging_bytes(self) -> int:
        return self.num_layers * self.staging_slots * self.bytes_per_expert

    @property
    def pcie_bytes_per_token(self) -> float:
        cold = (self.num_experts - self.on_gpu) / self.num_experts
        return self.num_layers * self.experts_used * cold * self.bytes_per_expert

    def device_bytes_saved(self) -> int:
        """How much less device memory than keeping every expert resident."""
        return self.host_bytes - self.staging_bytes


def fixed_plan(
    num_layers: int, num_experts: int, experts_used: int, expert_bytes_total: int, requested: int | str | None
) -> ExpertPlan:
    """The plan for a number (or "all"); "auto" is chosen by `auto_plan` against a budget."""
    if num_experts <= 0:
        raise ValueError("--experts-on-gpu: this model has no experts")
    per_expert = expert_bytes_total // (num_layers * num_experts)
    on_gpu = num_experts if requested in (None, "all") else requested
    if not isinstance(on_gpu, int):
        raise ValueError(f"fixed_plan takes a number or 'all', not {requested!r}")
    if on_gpu > num_experts:
        raise ValueError(f"--experts-on-gpu {on_gpu} is more than the model's {num_experts} experts per layer")
    return ExpertPlan(num_layers, num_experts, experts_used, per_expert, on_gpu)


def auto_plan(full: ExpertPlan, room_bytes: int) -> ExpertPlan:
    """The largest hot set whose resident experts and staging fit in `room_bytes` (0 if none does)."""
    for on_gpu in range(full.num_experts, -1, -1):
        plan = ExpertPlan(full.num_layers, full.num_experts, full.experts_used, full.bytes_per_expert, on_gpu)
        if plan.gpu_bytes + plan.staging_bytes <= room_bytes:
            return plan
    return ExpertPlan(full.num_layers, full.num_experts, full.experts_used, full.bytes_per_expert, 0)
