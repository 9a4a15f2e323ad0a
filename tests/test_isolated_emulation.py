"""Infrastructure (no points): the kernel labs graded isolated on a machine without a GPU.

``pagedlab grade`` emulates the kernel labs where there is no GPU, and grading isolated runs
the student's launchers in the worker. The worker must then run them on the emulated device
the test built its inputs for, and what a test records around them (racecheck, launch
streams, the compute capability it pretends) must reach the worker and come back. Until
2026-11-30 none did: the reference solutions scored 54/99 (Lab 4) and 60/124 (Lab 5) graded
isolated without a GPU, the default GitHub Classroom setup (found by a red team).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from reference.grader.sandbox import ISOLATED_ENV, IsolationError, ensure_worker_user
from reference.paths import REPO_ROOT

try:
    HOW, WHY = ensure_worker_user(), None
except IsolationError as exc:
    HOW, WHY = None, str(exc)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(HOW is None, reason=f"isolation unavailable: {WHY}")]

#: One test per thing that must cross: inputs built on the emulated device (the oracle
#: comparisons), racecheck reports, launch streams, a pretended capability, and the 4 GiB
#: cache that the codec cannot carry.
SELECTED = [
    ("labs/lab04_decode_kernels/test_lab04_kernels.py",
     "test_matches_oracle_on_ragged_batches and v1 or racecheck or current_torch_stream or "
     "4gib and v4"),
    ("labs/lab05_prefill_kernels/test_lab05_kernels.py",
     "racecheck and tiled or current_torch_stream and tiled"),
    ("labs/lab05_prefill_kernels/test_lab05_hopper.py", "refuses_off_hopper"),
]


@pytest.mark.parametrize("path, select", SELECTED, ids=["lab04", "lab05", "lab05_hopper"])
def test_kernel_tests_pass_isolated_on_the_emulated_device(path, select):
    """The solutions pass the selected kernel tests with student code in the worker
    (PAGEDLAB_ISOLATED) and kernels on the emulated device (PAGEDLAB_DEVICE=emulate), as
    `pagedlab grade --isolated` runs them on a CPU runner."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "LAB_IMPL")}
    env.update({ISOLATED_ENV: HOW, "PAGEDLAB_DEVICE": "emulate", "LAB_IMPL": "solution"})
    proc = subprocess.run([sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider",
                           "-m", "emulated", "-k", select], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, \d+ deselected in .*", last), out[-2000:]


def test_the_test_process_talks_to_a_worker():
    """With PAGEDLAB_ISOLATED the impl fixture is a worker proxy, and the worker runs the
    launchers on the emulated device the test process is on (so the test above is isolated)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    env.update({ISOLATED_ENV: HOW, "LAB_IMPL": "solution"})
    code = """
from reference.emulate import emulation
from reference.grader.proxy import Remote, remote_impl
from labs.lab04_decode_kernels._cases import GpuCase
impl = remote_impl("lab04_decode_kernels")
with emulation():
    case = GpuCase(3, [5, 17], 4, 2, 64, 16)
    out = impl.KERNELS["v1"](*case.args(), case.scale)
print(isinstance(impl, Remote), type(out).__name__, tuple(out.shape))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["True", "Tensor", "(2,", "4,", "64)"], \
        proc.stdout + proc.stderr[-2000:]
