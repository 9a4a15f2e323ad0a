"""Runs the lab tests in a child pytest process and reads back the graded JSON report.

Grading never runs student code in the grader's own process: a crash, ``sys.exit`` or a hung
kernel costs the child, and the grader still reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reference.paths import LABS_DIR, REPO_ROOT


@dataclass
class RunResult:
    """What one child pytest run produced."""

    exitstatus: int
    records: list[dict]
    collected: list[str]
    implementation: str
    output: str


class GradingRunError(RuntimeError):
    """The child pytest run produced no usable report (crash, usage error, nothing collected)."""


def run_lab_tests(
    labs: list[str] | None = None,
    *,
    impl: str | None = None,
    env: dict[str, str] | None = None,
    only: list[str] | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = 1800,
) -> RunResult:
    """Runs pytest over lab folders in a child process.

    Args:
        labs: lab folder names; None means every lab.
        impl: ``starter`` or ``solution`` (sets ``LAB_IMPL``); None keeps the environment's.
        env: extra environment variables for the child.
        only: keep only tests with these function names (``--pagedlab-only``).
        extra_args: more pytest arguments.
        timeout_s: wall-clock limit for the whole child run.

    Returns:
        The parsed report.

    Raises:
        GradingRunError: the child wrote no report, or collected nothing.
    """
    paths = [str(LABS_DIR / lab) for lab in labs] if labs else [str(LABS_DIR)]
    child_env = dict(os.environ)
    child_env.pop("PYTEST_ADDOPTS", None)
    if impl is not None:
        child_env["LAB_IMPL"] = impl
    child_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="pagedlab-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
               "--pagedlab-report", str(report), "--rootdir", str(REPO_ROOT),
               "-c", str(REPO_ROOT / "pyproject.toml")]
        if only:
            cmd += ["--pagedlab-only", ",".join(only)]
        cmd += extra_args or []
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=child_env, capture_output=True,
                                  text=True, timeout=timeout_s)
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            raise GradingRunError(f"pytest ran past {timeout_s:.0f}s\n{output[-3000:]}") from None
        if not report.exists():
            raise GradingRunError(f"pytest exited {code} without a report:\n{output[-3000:]}")
        data = json.loads(report.read_text())
    if not data["collected"]:
        raise GradingRunError(f"pytest collected no lab test (exit {code}):\n{output[-3000:]}")
    return RunResult(code, data["tests"], data["collected"], data["implementation"], output)
