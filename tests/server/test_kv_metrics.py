"""/metrics carries the KV tiers' counters: hits per tier, bytes moved, evictions, preemptions."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.engine.interface import EngineStats
from app.engine.server.metrics import ServerMetrics


class StatsOnly:
    def __init__(self, stats: EngineStats) -> None:
        self._stats = stats

    def stats(self) -> EngineStats:
        return self._stats


def test_kv_counters_are_exported_with_their_labels() -> None:
    stats = EngineStats(
        requests_running=0, requests_waiting=0, kv_blocks_used=0, kv_blocks_total=10, last_batch_size=0,
        max_batch_size_seen=0, prompt_tokens_total=0, generation_tokens_total=0, requests_finished_total=0,
        prefix_cache_hit_tokens_by_tier={"device": 160, "host": 32, "disk": 16},
        kv_bytes_moved={"device_to_host": 4096, "host_to_device": 2048, "to_disk": 1024, "from_disk": 512},
        kv_evicted_blocks_total=7, preemptions_total=3,
    )  # fmt: skip
    body, _ = ServerMetrics(StatsOnly(stats)).render()  # type: ignore[arg-type]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("paddock_engine_prefix_cache_hit_tokens_by_tier_total", (("tier", "host"),))] == 32
    assert samples[("paddock_engine_prefix_cache_hit_tokens_by_tier_total", (("tier", "disk"),))] == 16
    assert samples[("paddock_engine_kv_moved_bytes_total", (("direction", "to_disk"),))] == 1024
    assert samples[("paddock_engine_kv_evicted_blocks_total", ())] == 7
    assert samples[("paddock_engine_preemptions_total", ())] == 3
