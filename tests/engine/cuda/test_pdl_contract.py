"""The programmatic-launch contract of the kernels (kernels/runtime/pdl.py, common.cuh), read from their sources.

Inside a decode graph every kernel is launched with programmatic stream serialization: it may start as
soon as its predecessor has run `launch_next_grid()`, which the kernels do right after their own wait.
A kernel that never reaches `griddepcontrol.wait` may then read its inputs while the kernel that writes
them still runs: moe.cu's router read the previous replay's logits, so MoE models decoded other experts
in graphs than eagerly (issue 34). No emulator runs two grids at once, so the contract is checked on the
source: every `extern "C" __global__` kernel reaches `wait_previous_grid()` (or `after_previous_grid()`),
in its body or in a device function it calls. Not marked `gpu`: this runs in CI.
"""

from __future__ import annotations

import re

import pytest

from app.engine.kernels.runtime.compile import KERNEL_DIR

WAITS = ("wait_previous_grid", "after_previous_grid")
# Kernels never launched inside programmatic_launches(): the sampler runs after the graph's replay.
NOT_CAPTURED = {"sampling.cu"}
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*|[A-Z_]+\s+)?([\w#]+)\s*\('
)
_DEVICE = re.compile(r"__device__\s+(?:__forceinline__\s+|inline\s+|static\s+)*[\w:<>*&\s]+?\b(\w+)\s*\(")
_CALL = re.compile(r"\b(\w+)\s*(?:<[^;(){}]*>)?\s*\(")


def _body(source: str, start: int) -> str:
    """The brace-balanced body that follows `start` (the end of a signature's opening parenthesis)."""
    i = source.index("{", start)
    depth = 0
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[i : j + 1]
    raise AssertionError(f"unbalanced braces after offset {start}")


def _device_functions() -> dict[str, str]:
    """Every __device__ function of the kernel folder by name (overloads and templates merged)."""
    functions: dict[str, str] = {}
    for path in sorted(KERNEL_DIR.glob("*.cu*")):
        source = path.read_text(encoding="utf-8")
        for match in _DEVICE.finditer(source):
            end = source.find(";", match.end())
            brace = source.find("{", match.end())
            if brace < 0 or 0 <= end < brace:
                continue  # a declaration
            functions[match.group(1)] = functions.get(match.group(1), "") + _body(source, match.end())
    return functions


def _reaches_wait(body: str, functions: dict[str, str], seen: set[str]) -> bool:
    if any(w in body for w in WAITS):
        return True
    for name in set(_CALL.findall(body)) - seen:
        if name in functions:
            seen.add(name)
            if _reaches_wait(functions[name], functions, seen):
                return True
    return False


def _kernels() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(KERNEL_DIR.glob("*.cu")):
        if path.name in NOT_CAPTURED:
            continue
        source = path.read_text(encoding="utf-8")
        found += [(path.name, m.group(1), _body(source, m.end())) for m in _KERNEL.finditer(source)]
    return found


def test_the_scan_finds_the_kernels_and_a_missing_wait() -> None:
    """The checker sees moe.cu's kernels (the ones issue 34 was about) and flags a body without the wait."""
    names = {(f, k) for f, k, _ in _kernels()}
    moe = {
        "moe_route",
        "moe_count",
        "moe_offsets",
        "moe_scatter",
        "moe_grouped_##SUFFIX",
        "moe_gated",
        "moe_combine",
    }
    assert {("moe.cu", k) for k in moe} <= names
    functions = _device_functions()
    assert not _reaches_wait("{ const int t = threadIdx.x; out[t] = moe_sigmoid(x[t]); }", functions, set())
    assert _reaches_wait("{ moe_grouped<FmtQ8_0>(w, s, r, n, c, x, 0, o, f, k, b, y); }", functions, set())


@pytest.mark.parametrize(
    ("file", "kernel", "body"), [pytest.param(*k, id=f"{k[0]}:{k[1]}") for k in _kernels()]
)
def test_every_captured_kernel_waits_for_its_predecessor(file: str, kernel: str, body: str) -> None:
    assert _reaches_wait(body, _device_functions(), set()), (
        f"{file}: kernel {kernel} never reaches wait_previous_grid(); in a decode graph it may read its "
        "inputs before the kernel that writes them has finished (common.cuh, pdl.py)"
    )
