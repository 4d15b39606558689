"""app/engine/envs.py: every switch declared once, parsed by its type, read once; KernelOptions'
defaults come from it; docs/configuration.md lists exactly the declared switches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.engine import envs
from app.engine.kernels import gemv_plan
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.kernels.options import KernelOptions, ShapeOverrides
from app.engine.kernels.tuning import LaunchShape, for_arch

ROOT = Path(__file__).resolve().parents[2]
SWITCHES = [v.name for v in envs.DECLARED]


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch):
    """Set variables (the declared ones cleared first), then re-read; re-read again afterwards."""
    for name in SWITCHES:
        if not name.endswith("_"):
            monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        envs.reload()

    set_env()
    yield set_env
    monkeypatch.undo()
    envs.reload()


def test_unset_gives_the_declared_defaults(environ) -> None:
    assert envs.PADDOCK_PDL is True and envs.PADDOCK_DECODE_ROPE == "1" and envs.PADDOCK_GEMV_QB is None
    assert dict(envs.PADDOCK_GEMV_SHAPE_) == {} and dict(envs.PADDOCK_KERNEL_DEFINES) == {}
    assert KernelOptions() == KernelOptions(
        pdl=True, decode_attention=True, decode_clusters=True, decode_rope="auto", gemv_int_x=True,
        gemv_int_multi=True, gemv_resident_cap=True, gemv_groups_per_thread=None, fused_norm_max_cols=None,
        gemv_overrides=ShapeOverrides(),
    )  # fmt: skip


def test_values_are_parsed_and_read_once(environ, monkeypatch: pytest.MonkeyPatch) -> None:
    environ(PADDOCK_PDL="0", PADDOCK_GEMV_QB="1", PADDOCK_DECODE_ROPE="all", PADDOCK_GEMV_INT_X="")
    assert envs.PADDOCK_PDL is False and envs.PADDOCK_GEMV_QB == 1 and envs.PADDOCK_DECODE_ROPE == "all"
    assert envs.PADDOCK_GEMV_INT_X is True  # empty: the default
    monkeypatch.setenv("PADDOCK_PDL", "1")
    assert envs.PADDOCK_PDL is False  # cached until reload()
    envs.reload()
    assert envs.PADDOCK_PDL is True


def test_prefixed_families(environ) -> None:
    environ(PADDOCK_GEMV_SHAPE_MULTI="2,4,1", PADDOCK_GEMV_SHAPE_MULTI_Q8_0="1,8,1", PADDOCK_GEMV_MIN_BLOCKS="1",
            PADDOCK_GEMV_MIN_BLOCKS_GATED_Q6_K="4")  # fmt: skip
    assert dict(envs.PADDOCK_GEMV_SHAPE_) == {"MULTI": (2, 4, 1), "MULTI_Q8_0": (1, 8, 1)}
    assert envs.PADDOCK_GEMV_MIN_BLOCKS == 1 and dict(envs.PADDOCK_GEMV_MIN_BLOCKS_) == {"GATED_Q6_K": 4}


def test_a_family_with_a_default_keeps_the_entries_not_set(environ) -> None:
    assert dict(envs.PADDOCK_GEMV_MMA_COPY_) == dict(gemv_plan.MMA_COPY) == {"Q4_K": 16}
    assert GemvPlan().mma_copy == KernelOptions().gemv_mma_copy  # the plan benchmarks use is the backend's
    assert GemvPlan().mma_copy_tall == KernelOptions().gemv_mma_copy_tall == gemv_plan.MMA_COPY_TALL == 32
    assert GemvPlan().mma_splits == KernelOptions().gemv_mma_splits == gemv_plan.MMA_SPLITS == 8
    environ(PADDOCK_GEMV_MMA_COPY_Q4_K="0", PADDOCK_GEMV_MMA_COPY_Q5_K="8")
    assert dict(envs.PADDOCK_GEMV_MMA_COPY_) == {"Q4_K": 0, "Q5_K": 8}
    assert GemvPlan.for_backend(KernelOptions(), for_arch("90")).mma_copy == {"Q4_K": 0, "Q5_K": 8}


@pytest.mark.parametrize(
    ("name", "value"),
    [("PADDOCK_PDL", "maybe"), ("PADDOCK_GEMV_QB", "two"), ("PADDOCK_DECODE_ROPE", "some"),
     ("PADDOCK_GEMV_SHAPE_GATED", "2,8"), ("PADDOCK_GEMV_SHAPE_GATED", "2,0,1")],
)  # fmt: skip
def test_a_bad_value_names_its_variable(environ, name: str, value: str) -> None:
    environ(**{name: value})
    family = next(v.name for v in envs.DECLARED if name.startswith(v.name) and (v.prefix or v.name == name))
    with pytest.raises(ValueError, match=f"\\${name}.*{re.escape(value)}"):
        getattr(envs, family)


def test_an_undeclared_name_is_an_error() -> None:
    with pytest.raises(AttributeError, match="not a declared"):
        envs.PADDOCK_NOT_A_SWITCH  # noqa: B018


def test_switches_feed_the_kernel_options_and_the_gemv_plan(environ) -> None:
    environ(PADDOCK_PDL="0", PADDOCK_DECODE_ROPE="0", PADDOCK_GEMV_INT_MULTI="0", PADDOCK_GEMV_QB="1",
            PADDOCK_FUSED_NORM_MAX_COLS="4096", PADDOCK_GEMV_SHAPE_SINGLE_Q4_K="1,4,1")  # fmt: skip
    options = KernelOptions()
    assert not options.pdl and options.decode_rope == "off" and not options.gemv_int_multi
    assert KernelOptions(pdl=True).pdl  # an explicit field wins over the switch
    plan = GemvPlan.for_backend(options, for_arch("90"))
    assert (
        plan.int_x and not plan.int_multi and plan.max_groups_per_thread == 1 and plan.norm_max_cols == 4096
    )
    assert plan.int_shape("SINGLE", 4096, "Q4_K") == LaunchShape(1, 4, 1, 1)  # the tuned cap kept
    assert plan.int_shape("SINGLE", 4096, "Q8_0") == LaunchShape(2, 8, 2, 2)


def test_kernel_options_reject_an_unknown_rope_mode() -> None:
    with pytest.raises(ValueError, match="decode_rope"):
        KernelOptions(decode_rope="sometimes")  # type: ignore[arg-type]


def test_configuration_doc_lists_every_switch() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert envs.with_table(doc) == doc, (
        "docs/configuration.md is stale: python -m app.engine.envs docs/configuration.md"
    )


def test_only_envs_reads_the_environment() -> None:
    """Every other engine module goes through envs.py (its declarations are the whole list)."""
    readers = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "app" / "engine").rglob("*.py"))
        if re.search(r"os\.environ|os\.getenv|getenv\(", path.read_text()) and path.name != "envs.py"
    ]
    assert readers == []
