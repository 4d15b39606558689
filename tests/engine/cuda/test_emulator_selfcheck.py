"""The SIMT emulator itself (host/simt_emulator.h): what every emulated kernel test relies on.

Shared memory written before a barrier is seen after it by every thread of the block, across warps
and blocks; a shuffle exchanges lanes; threads that wait at a barrier the others never reach end
in the emulator's deadlock report (exit by abort), as such a kernel would misbehave on a GPU.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from emulator import TIMEOUT, build, run


@pytest.fixture(scope="module")
def selfcheck(tmp_path_factory):
    return build(tmp_path_factory, "selfcheck_main.cpp")


def test_barriers_shared_memory_and_shuffles_across_warps_and_blocks(selfcheck, tmp_path) -> None:
    out_path = tmp_path / "out.bin"
    run(selfcheck, "order", out_path)
    blocks, threads = 3, 128
    t = np.arange(threads)
    expected = np.concatenate([1000 * b + (threads - 1 - t) + 100000 * ((t % 32) ^ 5) for b in range(blocks)])
    np.testing.assert_array_equal(np.fromfile(out_path, np.int32), expected)


def test_threads_stuck_at_a_barrier_the_others_skip_are_reported_as_a_deadlock(selfcheck) -> None:
    done = subprocess.run([str(selfcheck), "diverge"], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode != 0
    assert "deadlock in block (0,0,0): 16 threads wait at barriers no other thread reaches" in done.stderr
