"""`paddock serve`'s KV flags reach EngineConfig, and a setting the engine cannot run is refused early."""

from __future__ import annotations

import pytest

from app.cli import build_parser
from app.commands.common import engine_config


def test_serve_kv_flags_become_engine_config_fields() -> None:
    args = build_parser().parse_args(
        ["serve", "--prefix-cache", "off", "--kv-dtype", "fp8", "--kv-host-gb", "1.5", "--kv-disk-gb", "20",
         "--kv-disk-dir", "/tmp/kv"]
    )  # fmt: skip
    config = engine_config(args)
    assert config.enable_prefix_caching is False and config.kv_dtype_name == "fp8"
    assert (config.kv_host_gb, config.kv_disk_gb, config.kv_disk_dir) == (1.5, 20.0, "/tmp/kv")


def test_serve_kv_defaults() -> None:
    config = engine_config(build_parser().parse_args(["serve"]))
    assert config.enable_prefix_caching is True and config.kv_dtype_name == "auto"
    assert config.kv_host_gb == 4.0 and config.kv_disk_gb == 0.0  # the disk tier is opt-in


def test_an_unknown_kv_dtype_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-dtype", "int4"])
    assert "--kv-dtype" in capsys.readouterr().err


def test_prefix_cache_off_means_no_reuse_even_with_tiers_given() -> None:
    from app.engine.backend.cpu import CpuBackend
    from app.engine.cache.manager import KVCacheManager
    from app.engine.cache.offload import DeviceBlocks, HostTier, KVTiers
    from app.engine.request import Request
    from app.engine.sampling_params import SamplingParams

    backend = CpuBackend()
    copier = DeviceBlocks(backend, [backend.alloc_kv_cache(8, 4, 1, 2)])
    kv = KVCacheManager(8, 4, enable_prefix_caching=False, tiers=KVTiers(copier, 4, HostTier(4, copier), None))
    assert kv.prefix_cache is None and kv.tiers is None
    first = Request("a", list(range(12)), SamplingParams())
    kv.match_prefix(first)
    kv.allocate(first, 12)
    first.num_computed_tokens = 12
    kv.free(first)
    second = Request("b", list(range(12)), SamplingParams())
    assert kv.match_prefix(second) == 0 and second.num_cached_tokens == 0
    kv.check_integrity()
