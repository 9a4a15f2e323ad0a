"""Infrastructure (no points): a student's code cannot hang, crash or exit its way to points.

Each test grades a synthetic workbook (tests/grading_helpers.py) whose starter misbehaves on
purpose: an endless loop, ``os._exit(0)``, a self-kill, ``sys.exit``, a forged report line.
"""

from __future__ import annotations

import time

import pytest

from grading_helpers import by_name, grade, make_workbook
from reference.gpu import gpu_skip_reason

# Minutes on 2 cores (builds, subprocess grading runs): CI runs them with `pytest -m slow`.
pytestmark = pytest.mark.slow

TESTS = '''
    import pytest

    @pytest.mark.points(1)
    def test_first(impl):
        assert impl.ok() == 1

    @pytest.mark.points(2)
    def test_bad(impl):
        impl.misbehave()

    @pytest.mark.points(1)
    def test_third(impl):
        assert impl.ok() == 1

    @pytest.mark.points(1)
    def test_fourth(impl):
        assert impl.ok() == 1
'''


def _lab(misbehave_body: str, header: str = "") -> dict[str, str]:
    starter = f"import os, signal, sys, time\n{header}\ndef ok():\n    return 1\n\n" \
              f"def misbehave():\n    {misbehave_body}\n"
    return {"starter.py": starter, "test_lab90_x.py": TESTS}


def test_infinite_loop_costs_one_test(tmp_path):
    """A test that never returns fails with a timeout; the tests after it still run and pass."""
    root = make_workbook(tmp_path, {"lab90_loop": _lab("while True: pass")})
    start = time.monotonic()
    proc, res = grade(root, "--timeout", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = by_name(res)
    assert tests["test_bad"]["status"] == "failed"
    assert "Timeout" in tests["test_bad"]["output"], tests["test_bad"]["output"]
    assert [tests[n]["status"] for n in ("test_first", "test_third", "test_fourth")] == ["passed"] * 3
    assert res["score"] == 3 and res["max_score"] == 5
    assert time.monotonic() - start < 60


def test_hang_outside_python_is_killed_by_the_watchdog(tmp_path):
    """A test stuck where pytest-timeout's signal cannot reach it (SIGALRM blocked, as in a
    hung kernel) is killed by the grader; the rest of the lab is re-run and graded."""
    body = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM}); time.sleep(600)"
    root = make_workbook(tmp_path, {"lab90_hang": _lab(body)})
    proc, res = grade(root, "--timeout", "2", env={"PAGEDLAB_KILL_GRACE_S": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = by_name(res)
    assert tests["test_bad"]["status"] == "failed"
    assert "per-test timeout" in tests["test_bad"]["output"], tests["test_bad"]["output"]
    assert res["score"] == 3


@pytest.mark.parametrize("body, cause", [
    ("os._exit(0)", "exited with code 0"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
])
def test_process_death_fails_the_running_test_and_the_rest_still_run(tmp_path, body, cause):
    """os._exit(0) or a self-kill mid-run: the running test fails naming the cause (never a
    pass), and the tests that had not run yet are re-run in a fresh process."""
    root = make_workbook(tmp_path, {"lab90_exit": _lab(body)})
    proc, res = grade(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = by_name(res)
    assert tests["test_bad"]["status"] == "failed" and tests["test_bad"]["score"] == 0
    assert cause in tests["test_bad"]["output"], tests["test_bad"]["output"]
    assert res["score"] == 3 and res["max_score"] == 5


def test_sys_exit_is_an_ordinary_failure(tmp_path):
    """sys.exit() inside student code fails that test like any exception."""
    root = make_workbook(tmp_path, {"lab90_sysexit": _lab("sys.exit(0)")})
    proc, res = grade(root)
    tests = by_name(res)
    assert tests["test_bad"]["status"] == "failed" and "SystemExit" in tests["test_bad"]["output"]
    assert res["score"] == 3


def test_exit_at_import_earns_nothing_and_other_labs_are_unharmed(tmp_path):
    """A starter that calls os._exit(0) when imported kills every attempt: its lab scores 0
    with every test failed, and another lab graded in the same run keeps its full score."""
    crashing = _lab("pass", header="os._exit(0)")
    healthy = _lab("return None")
    root = make_workbook(tmp_path, {"lab90_crash": crashing, "lab91_fine": healthy})
    proc, res = grade(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crash = [t for t in res["tests"] if "lab90_crash" in t["tags"]]
    fine = [t for t in res["tests"] if "lab91_fine" in t["tags"]]
    assert len(crash) == 4 and all(t["status"] == "failed" for t in crash)
    assert all("died" in t["output"] for t in crash), [t["output"] for t in crash]
    assert all(t["status"] == "passed" for t in fine)
    assert res["score"] == 5 and res["max_score"] == 10


def test_forged_report_lines_do_not_count(tmp_path):
    """Student code that appends 'passed' lines to the grading log gains nothing, and the
    grade says the log was tampered with."""
    body = '''
    path = sys.argv[sys.argv.index("--pagedlab-log") + 1]
    import json
    for name in ("test_bad", "test_first"):
        line = {"sig": "0" * 64, "body": {"event": "result", "outcome": "passed",
                "nodeid": f"labs/lab90_forge/test_lab90_x.py::{name}"}}
        open(path, "a").write(json.dumps(line) + "\\n")
    raise RuntimeError("forged")'''.replace("\n", "\n    ")
    root = make_workbook(tmp_path, {"lab90_forge": _lab(body)})
    proc, res = grade(root)
    tests = by_name(res)
    assert tests["test_bad"]["status"] == "failed"
    assert res["score"] == 3
    assert "forged" in res["output"]
    assert proc.returncode == 3, proc.stdout + proc.stderr  # graded, but not trustworthy


ILLEGAL_ADDRESS_STARTER = '''
    import cupy

    _KERNEL = cupy.RawKernel(r"""
    extern "C" __global__ void poke(float* out) {
        // NOTE: deliberately wrong: writes far outside any allocation -> illegal address.
        out[(long long)1 << 40] = 1.0f;
    }
    """, "poke")


    def run_kernel():
        out = cupy.zeros(4, dtype=cupy.float32)
        _KERNEL((1,), (1,), (out,))
        cupy.cuda.Device().synchronize()
        return out
'''

HEALTHY_GPU_STARTER = '''
    import cupy


    def run_kernel():
        out = cupy.arange(4, dtype=cupy.float32) * 2
        cupy.cuda.Device().synchronize()
        return out
'''

GPU_TESTS = '''
    import pytest

    @pytest.mark.points(1)
    def test_kernel(impl):
        assert float(impl.run_kernel().sum()) >= 0

    @pytest.mark.points(1)
    def test_kernel_again(impl):
        assert float(impl.run_kernel().sum()) >= 0
'''


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
def test_illegal_address_kernel_costs_only_its_own_lab(tmp_path):
    """[GPU] A kernel writing to an illegal address fails its own lab's tests (the CUDA error
    is sticky in that process) but a second GPU lab in the same grading run still passes."""
    root = make_workbook(tmp_path, {
        "lab90_bad_kernel": {"starter.py": ILLEGAL_ADDRESS_STARTER, "test_lab90_gpu.py": GPU_TESTS},
        "lab91_good_kernel": {"starter.py": HEALTHY_GPU_STARTER, "test_lab91_gpu.py": GPU_TESTS},
    })
    proc, res = grade(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = [t for t in res["tests"] if "lab90_bad_kernel" in t["tags"]]
    good = [t for t in res["tests"] if "lab91_good_kernel" in t["tags"]]
    assert bad and all(t["status"] == "failed" for t in bad), bad
    assert "illegal" in bad[0]["output"].lower() or "died" in bad[0]["output"], bad[0]["output"]
    assert good and all(t["status"] == "passed" for t in good), good
    assert res["score"] == 2


def test_a_lab_with_its_own_conftest_is_graded(tmp_path):
    """A lab folder may carry a conftest.py with fixtures (Lab 2 does); grading still collects it.

    Regression: the grading log's plugin object must be hashable, since pytest keeps plugins in
    sets once a folder below the root has its own conftest.
    """
    root = make_workbook(tmp_path / "wb", {
        "lab01_local": {
            "conftest.py": """
                import pytest

                @pytest.fixture
                def answer():
                    return 42
            """,
            "starter.py": "VALUE = 42\n",
            "test_lab01_local.py": """
                import pytest

                @pytest.mark.points(2)
                def test_uses_the_local_fixture(impl, answer):
                    assert impl.VALUE == answer
            """,
        },
    })
    proc, results = grade(root, env={"LAB_IMPL": "starter"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results["score"] == 2 and results["max_score"] == 2
