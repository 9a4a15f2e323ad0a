"""GitHub Classroom: per-lab grading steps with partial credit, and the workflow that runs them.

GitHub Classroom's reporter action (``classroom-resources/autograding-grading-reporter``) reads,
for each runner id listed in its ``runners`` input, the environment variable
``<ID>_RESULTS``: base64 of a JSON result ``{"version": 1, "status": "pass"|"fail"|"error",
"max_score": M, "tests": [{"name", "status", "score", "message", ...}]}``. It adds up every
test's ``score`` against each runner's ``max_score``. The stock command grader gives all or
nothing per step; ``pagedlab grade <lab> --classroom`` writes the same result with one entry per
test and its points, so a lab earns partial credit.

The workflow (``reference/grader/templates/classroom.yml``) has one such step per lab, rendered by
``pagedlab release`` with each lab's maximum from the manifest.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
from fractions import Fraction
from pathlib import Path

from reference.grader.results import TestResult, points_float

TEMPLATE = Path(__file__).resolve().parent / "templates" / "classroom.yml"


def runner_id(lab: str) -> str:
    """Returns the workflow step id for a lab (``lab01_block_manager`` -> ``lab01``)."""
    return lab.split("_", 1)[0]


def classroom_result(records: list[TestResult], max_score: Fraction | float | None = None,
                     error: str | None = None) -> dict:
    """Builds one runner's result in the Classroom reporter's format.

    The cases of a parametrized test are reported as one entry (its points times the share of
    cases that passed): the reporter adds up scores as floats, and whole-function entries keep
    a full score exact (41, not 40.9993 from thirds).

    Args:
        records: the graded records of the step's lab(s).
        max_score: the step's maximum (default: the records' points).
        error: set when grading failed; the step then reports status ``error`` and 0 points.

    Returns:
        The result dict (see the module docstring).
    """
    groups: dict[str, list[TestResult]] = {}
    for rec in records:
        groups.setdefault(rec.nodeid.split("[")[0], []).append(rec)
    tests = []
    for key, cases in groups.items():
        passed = [c for c in cases if c.passed]
        failed = [c for c in cases if not c.passed]
        points = sum((c.points for c in cases), Fraction(0))
        earned = sum((c.points for c in passed), Fraction(0))
        message = ""
        if failed:
            message = failed[0].message[:1000]
            if len(cases) > 1:
                message = f"{len(failed)} of {len(cases)} cases failed; first: {message}"
        tests.append({
            "name": key.split("::", 1)[-1],
            "status": "pass" if not failed else "fail",
            "score": points_float(earned),
            "message": message,
            "test_code": "",
            "filename": key.split("::", 1)[0],
            "line_no": 0,
            "duration": int(1000 * sum(c.duration_s for c in cases)),
        })
    if max_score is None:
        max_score = sum((rec.points for rec in records), Fraction(0))
    if error:
        status = "error"
        tests.append({"name": "grading", "status": "error", "score": 0, "message": error[:2000],
                      "test_code": "", "filename": "", "line_no": 0, "duration": 0})
    else:
        status = "pass" if tests and all(t["status"] == "pass" for t in tests) else "fail"
    return {"version": 1, "status": status, "max_score": points_float(Fraction(max_score)),
            "tests": tests}


def encode_result(result: dict) -> str:
    """Returns the base64 text the reporter expects in ``<ID>_RESULTS``."""
    return base64.b64encode(json.dumps(result).encode()).decode()


def write_step_output(result: dict, path: str | None = None) -> str:
    """Appends ``result=<base64>`` to ``$GITHUB_OUTPUT`` (or ``path``).

    Returns:
        The line written (printed instead when there is nowhere to write it).
    """
    line = f"result={encode_result(result)}"
    target = path or os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a") as fh:
            fh.write(line + "\n")
    else:
        print(line)
    return line


def reporter_total(encoded_results: dict[str, str]) -> tuple[float, float]:
    """Adds up runner results the way the Classroom reporter does (for tests and local checks).

    Args:
        encoded_results: runner id -> base64 result.

    Returns:
        (total score, total max score).
    """
    total = maximum = 0.0
    for text in encoded_results.values():
        result = json.loads(base64.b64decode(text))
        if not result.get("max_score"):
            continue
        maximum += result["max_score"]
        total += sum(t.get("score", 0) for t in result["tests"])
    return round(total, 4), round(maximum, 4)


def grading_dependencies() -> list[str]:
    """The packages a grading runner installs (the project's and its ``dev`` extra's, torch
    left out: the workflow takes its CPU build), read from this workbook's pyproject.toml."""
    from reference.paths import REPO_ROOT, load_toml

    project = load_toml((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [d for d in wanted if not d.replace(" ", "").startswith(("torch>", "torch=", "torch<"))
            and d.split(";")[0].strip() != "torch"]


def render_workflow(lab_max: dict[str, float], *, python: str, torch_pin: str,
                    manifest_digest: str) -> str:
    """Renders the Classroom workflow: one grading step per lab, then the reporter.

    Args:
        lab_max: lab -> its maximum points (from the manifest), in lab order.
        python: Python version for ``actions/setup-python``.
        torch_pin: e.g. ``torch==2.13.0`` (the CPU build comes from PyTorch's CPU index).
        manifest_digest: the release manifest's digest, checked by every grading step.

    Returns:
        The workflow YAML text.
    """
    steps = []
    for lab, max_points in lab_max.items():
        rid = runner_id(lab)
        steps.append(
            f"      - name: {lab} ({max_points:g} points)\n"
            f"        id: {rid}\n"
            f"        if: always()\n"
            f"        run: python -m reference.tools.cli grade {lab} --classroom "
            f"--manifest-digest {manifest_digest}"
            f" --results results-{rid}.json --summary summary-{rid}.md\n"
        )
    env = "".join(f"          {runner_id(lab).upper()}_RESULTS: "
                  f"\"${{{{ steps.{runner_id(lab)}.outputs.result }}}}\"\n" for lab in lab_max)
    runners = ",".join(runner_id(lab) for lab in lab_max)
    text = TEMPLATE.read_text()
    deps = " ".join(shlex.quote(d) for d in grading_dependencies())
    for key, value in {"@PYTHON@": python, "@TORCH@": torch_pin, "@STEPS@": "".join(steps),
                       "@DEPS@": deps,
                       "@ENV@": env, "@RUNNERS@": runners}.items():
        text = text.replace(key, value)
    return text
