"""Infrastructure (no points): once a kernel loses the CUDA context, later failures say so
(``reference/context_lost.py``). Checked off a GPU with a stand-in for the context check."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from reference.context_lost import cuda_context_lost, lost_context_note
from reference.gpu import gpu_skip_reason
from reference.paths import REPO_ROOT

RUN = '''
    import reference.context_lost as plugin


    def test_healthy_failure():
        assert 1 == 2, "an ordinary failure"


    def test_faulting_kernel():
        plugin.cuda_context_lost = lambda: True  # stands in for a kernel's illegal address
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


    def test_passes_anyway():
        pass


    def test_next_stage():
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
'''


# The same run on a real GPU: a kernel's illegal address, then CUDA work in later tests.
GPU_RUN = '''
    import cupy
    import torch

    _POKE = cupy.RawKernel(r"""
    extern "C" __global__ void poke(float* out) {
        out[(long long)1 << 40] = 1.0f;  // NOTE: deliberately far outside any allocation
    }
    """, "poke")


    def test_healthy_failure():
        assert torch.ones(2, device="cuda").sum().item() == 3, "an ordinary failure"


    def test_faulting_kernel():
        out = cupy.zeros(4, dtype=cupy.float32)
        _POKE((1,), (1,), (out,))
        cupy.cuda.Device().synchronize()


    def test_passes_anyway():
        pass


    def test_next_stage():
        assert torch.ones(2, device="cuda").sum().item() == 2
'''


def _run_plugin(tmp_path, source: str, env: dict) -> str:
    """Runs ``source`` as a test file under the plugin in a fresh pytest process; its stdout."""
    (tmp_path / "test_run.py").write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_run.py"), "-p", "reference.context_lost",
         "-p", "no:cacheprovider", "-q", "-rA", f"--rootdir={tmp_path}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "400"})
    return proc.stdout + proc.stderr


def _assert_notes(out: str) -> None:
    """The healthy failure has no note, the faulting test the 'lost' note, the later failure's
    summary line names the faulting test."""
    assert "3 failed, 1 passed" in out, out
    healthy = out.split("_ test_healthy_failure _")[1].split("_ test_faulting_kernel _")[0]
    assert "NOTE" not in healthy, healthy
    faulting = out.split("_ test_faulting_kernel _")[1].split("_ test_next_stage _")[0]
    assert "lost when this test failed" in faulting, faulting
    summary = [line for line in out.splitlines() if line.startswith("FAILED") and "test_next_stage" in line]
    assert summary and "not this test's own failure" in summary[0] and "test_faulting_kernel" in summary[0], out


def test_the_notes_name_the_test_where_the_context_was_lost():
    """The faulting test's note says it lost the context; a later test's names that test and
    how to run the later one alone."""
    first = lost_context_note("labs/x/test_a.py::test_v3", "labs/x/test_a.py::test_v3")
    later = lost_context_note("labs/x/test_a.py::test_v4[v4]", "labs/x/test_a.py::test_v3")
    assert "lost when this test failed" in first
    assert "not this test's own failure" in later and "labs/x/test_a.py::test_v3;" in later
    assert "pytest 'labs/x/test_a.py::test_v4[v4]'" in later


def test_no_cuda_context_is_never_lost():
    """Off a GPU (no CUDA context made) the check answers False without touching CUDA."""
    assert cuda_context_lost() is False


def test_failures_after_a_lost_context_carry_the_note(tmp_path):
    """In one pytest run: a failure before the loss gets no note, the faulting test gets the
    'lost when this test failed' note, a later pass stays a pass, and a later failure's last
    line names the faulting test."""
    _assert_notes(_run_plugin(tmp_path, RUN, {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}))


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
def test_a_real_illegal_address_is_noticed(tmp_path):
    """[GPU] The same on a GPU with no stand-in: a CuPy kernel's illegal address loses the
    context, and the plugin's stream query sees it after that test and the next."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))
    _assert_notes(_run_plugin(tmp_path, GPU_RUN, env))
