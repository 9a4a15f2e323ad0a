"""Infrastructure (no points): speed grading on a real GPU (``.ci/gpu`` runs it alone on the GPU).

Proves that the timing path works end to end — record in another process, check, compile and
replay in a child that imports no student Python, compare every output with the float64
oracle — for every graded stage of the solution, and that each speed mutant (a kernel that
returns early, writes nothing, skips work or replays a cached result) scores 0. No assertion
here is about how fast anything is: the points the solution earns are printed, and the
thresholds live in ``SPEED_STAGES`` and the handouts.
"""

from __future__ import annotations

import os

import pytest
import torch

from reference.grader import speed
from reference.grader.mutants import build_mutant
from reference.grader.sandbox import _has_sudo, _is_root

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LABS = ["lab04_decode_kernels", "lab05_prefill_kernels"]


def test_every_stage_of_the_solution_is_timed_with_correct_outputs(monkeypatch):
    """Each graded stage of the solution records, replays and matches the oracle on every
    launch of every pass (the table shows its time and points); a stage for another GPU (the
    Hopper stage elsewhere) is skipped."""
    monkeypatch.setenv("LAB_IMPL", "solution")
    results = speed.grade_speed(LABS, isolated=False)
    print("\n" + speed.format_speed_table(results))
    assert {r["stage"] for r in results} == {s.stage for s in speed.SPEED_STAGES}
    bad = [f"{r['stage']}: {r['message']}" for r in results if not r["ok"] and not r.get("skipped")]
    assert not bad, bad


@pytest.mark.parametrize("mutant", speed.load_speed_mutants(), ids=lambda m: m.name)
def test_a_kernel_that_fakes_speed_scores_zero(mutant, tmp_path, monkeypatch):
    """A kernel that would look fast to a careless timer scores 0: its outputs are wrong on
    launches it skipped or never stored, and every launch's output is checked."""
    folder = build_mutant(mutant, tmp_path)
    monkeypatch.setenv("PAGEDLAB_IMPL_DIR", str(folder))
    stage = mutant.caught_by[0].split(":")[1]
    (result,) = speed.grade_speed([mutant.lab], isolated=False, stages=[stage])
    if result.get("skipped"):
        pytest.skip(result["message"])
    print(f"\n{mutant.name}: {result.get('message')}")
    assert result["points"] == 0 and not result["ok"], result
    assert "wrong output" in result["message"], result["message"]


@pytest.mark.skipif(not (_is_root() or _has_sudo()), reason="isolation needs root or sudo")
def test_an_isolated_recording_is_what_a_child_process_records(monkeypatch):
    """Graded isolated, the launcher runs in the unprivileged worker and its recording is the
    same as the one a plain child process makes."""
    monkeypatch.setenv("LAB_IMPL", "solution")
    stage = next(s for s in speed.SPEED_STAGES if s.stage == "v6")
    plain = speed.record_stage(stage, isolated=False)
    isolated = speed.record_stage(stage, isolated=True)
    assert "error" not in isolated, isolated

    def shape(rec):
        return [(la["name"], la["grid"], la["block"], la["args"]) for la in rec["launches"]]

    assert shape(isolated) == shape(plain)
    assert os.environ.get("PAGEDLAB_IMPL_DIR") is None
