"""Runs the lab tests in child pytest processes — one per lab — and grades from a signed log.

Grading never runs student code in the grader's own process, and it never trusts the test
process to say how it went:

* **One child per lab.** A crash, a sticky CUDA error (an illegal memory access poisons the
  CUDA context of its process) or a hang costs that lab's child, never the other labs. Graded
  isolated, the student's kernels run in the worker, which exits after a call that lost its
  context (:mod:`reference.grader.worker`): the next test gets a fresh one.
* **Per-test timeout.** pytest-timeout fails a test that runs past ``test_timeout_s``; a test
  stuck outside Python (a hung kernel, a C loop) is killed by the watchdog here a little later.
* **Completeness.** The child logs the tests it collected before any student code is imported,
  then each test's start and result (:mod:`reference.grader.signed_log`). Every expected test without
  a result is graded *failed*: the one that was running when the child died gets the cause
  (exit code or signal), and the child is restarted on the tests not yet run (at most
  ``MAX_RESTARTS`` times per lab). A test process that calls ``os._exit(0)`` or kills itself
  can therefore lose points, never gain them.
* **Expected tests** come from the collection, or — in a release or a grading bundle — from the
  manifest (``expected``), so a deleted or broken test file fails its tests instead of
  shrinking the maximum.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from reference.grader.bytecode import python_argv
from reference.grader.hidden import hidden_dirs
from reference.grader.results import TestResult, parse_points
from reference.grader.sandbox import (HOMES_ENV, ISOLATED_ENV, ensure_worker_user,
                                      in_process_reason, kill_orphaned_worker_processes,
                                      make_homes_folder, pid_namespace_works,
                                      remove_homes_folder)
from reference.grader.shared import CUDA_ENV
from reference.paths import LABS_DIR, REPO_ROOT, is_hidden_path, lab_names
from reference.grader.signed_log import KEY_FD_ENV, LogTail, key_pipe, new_key

#: Per-test limit when grading (seconds). The slowest lab test takes a few seconds on a CPU.
DEFAULT_TEST_TIMEOUT_S = 60.0
#: Isolated grading multiplies the per-test limit (and the lab's): every call to student code
#: is a round trip to the worker (measured: ``pagedlab bench isolation``, README). Lab 1's
#: state machine makes ~10^5 of them; on a loaded 2-core machine each can cost 0.5 ms.
ISOLATED_TIMEOUT_FACTOR = 3.0
#: How long past the per-test limit the watchdog waits before killing a stuck test process
#: (``PAGEDLAB_KILL_GRACE_S`` overrides it; the infrastructure tests shorten it).
KILL_GRACE_S = float(os.environ.get("PAGEDLAB_KILL_GRACE_S", "15"))
#: Child restarts per lab after the test process died; the rest then fail unrun.
MAX_RESTARTS = 3


class ProgressFn(Protocol):
    """What the runner reports to (see :class:`reference.grader.progress.Progress`)."""

    def start(self, lab: str) -> None: ...
    def update(self, lab: str, done: int, total: int) -> None: ...
    def end(self, lab: str, records: list[TestResult]) -> None: ...


@dataclass
class RunResult:
    """What grading some labs produced."""

    exitstatus: int
    records: list[TestResult]  # one per expected test, in order
    collected: list[str]  # the expected node ids
    implementation: str
    output: str  # the children's output (tail per lab)
    problems: list[str] = field(default_factory=list)  # collection errors, unexpected tests
    notes: list[str] = field(default_factory=list)  # facts for the reader that need no look


class GradingRunError(RuntimeError):
    """A lab could not be graded at all (no test collected, nothing expected known)."""


@dataclass
class _Child:
    returncode: int
    killed: str | None  # why the watchdog killed it, if it did
    output: str
    events: list[dict]
    rejected: int


def run_lab_tests(
    labs: list[str] | None = None,
    *,
    impl: str | None = None,
    env: dict[str, str] | None = None,
    only: list[str] | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = 1800,
    test_timeout_s: float | None = DEFAULT_TEST_TIMEOUT_S,
    include_hidden: bool = True,
    expected: dict[str, dict[str, object]] | None = None,
    progress: ProgressFn | None = None,
    isolated: bool = False,
    jobs: int = 1,
) -> RunResult:
    """Runs the tests of each lab in its own child pytest process.

    Args:
        labs: lab folder names; None means every lab.
        impl: ``starter`` or ``solution`` (sets ``LAB_IMPL``); None keeps the environment's.
        env: extra environment variables for the children.
        only: keep only tests with these function names (``--pagedlab-only``).
        extra_args: more pytest arguments.
        timeout_s: wall-clock limit per lab.
        test_timeout_s: per-test limit; None disables it.
        include_hidden: also run each lab's hidden tests (:mod:`reference.grader.hidden`), in
            a later phase of their own (a fresh test process, after the public tests); grading
            isolated, their folders are first made unreadable by other users (the worker's).
        expected: lab -> {node id: points (a number or ``"n/d"``)} the run must account for
            (a manifest's list);
            labs absent here expect what their collection finds.
        progress: told when each lab starts and ends, and as test results arrive.
        isolated: run student code only in an unprivileged worker process
            (:mod:`reference.grader.proxy`); the tests and this log stay in the test process.
            Both time limits are then :data:`ISOLATED_TIMEOUT_FACTOR` times longer.
        jobs: labs graded at once (each in its own child process).

    Returns:
        Records for every expected test of every lab (failed where no result came back).

    Raises:
        GradingRunError: a lab's child collected nothing and nothing was expected of it, or
            no lab had any test.
        IsolationError: ``isolated`` but no other user can run student code here.
    """
    plain_env, notes = env, []
    if isolated:
        # Refuse now, saying why, rather than fail every test; the test processes learn how
        # to switch users from the variable (root or sudo).
        # NOTE: CUDA_ENV: one allocation per tensor, so CUDA IPC hands the worker only the
        # tensors a test passes it (see reference.grader.shared).
        env = {**(env or {}), ISOLATED_ENV: ensure_worker_user(), **CUDA_ENV}
        if not pid_namespace_works():
            # NOTE: for the instructor's log, not the students' notes: one container per
            # submission (Gradescope) makes it moot, and it would only tell an attacker more.
            print("pagedlab: workers run without PID namespaces of their own (the grader is "
                  "not root, the container forbids unshare, or the machine has an NVIDIA "
                  "GPU): what student code leaves running is stopped only by the orphan sweep "
                  "after each test process", file=sys.stderr)
        timeout_s *= ISOLATED_TIMEOUT_FACTOR
        if test_timeout_s:
            test_timeout_s *= ISOLATED_TIMEOUT_FACTOR
    def grade_lab(lab: str) -> tuple[list, str | None]:
        lab_env, note = env, None
        reason = in_process_reason(lab) if isolated else None
        if reason:
            # NOTE: a correct submission must never lose points to the isolation itself: a lab
            # whose tests the worker cannot serve yet is graded in-process, and the report says so.
            lab_env = plain_env
            note = f"{lab}: graded in-process, not isolated ({reason})"
        want = (expected or {}).get(lab)
        hidden = [d for d in hidden_dirs(lab) if any(d.glob("test_*.py"))] \
            if include_hidden else []
        if only:
            # NOTE: a phase none of whose tests is asked for is not started at all (a mutant
            # check names public tests): it would only start a worker for nothing.
            hidden = [d for d in hidden if _defines_any(d, only)]
        if isolated and not reason:
            for folder in hidden:
                _private(folder)
        common = dict(impl=impl, env=lab_env, only=only, extra_args=extra_args,
                      timeout_s=timeout_s, test_timeout_s=test_timeout_s, progress=progress)
        # NOTE: hidden tests run in a later phase of their own: a fresh test process (and
        # worker), after every public test of the lab has finished, so nothing the student's
        # code saw or kept during the public tests meets them, and they are not even
        # collected while it runs.
        if progress:
            progress.start(lab)
        phases = [_run_lab(lab, paths=[_rel(LABS_DIR / lab)], expected=_part(want, False),
                           **common)]
        if hidden:
            phases.append(_run_lab(lab, paths=[_rel(d) for d in hidden],
                                   expected=_part(want, True), **common))
        if progress:
            progress.end(lab, [r for run in phases for r in run.records])
        return phases, note

    # NOTE: labs in parallel only when asked (check's solution and starter runs): a grade
    # reports lab by lab, and an isolated lab keeps about one core busy (test process and
    # worker take turns), so two at once use a 2-core machine.
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        graded = list(pool.map(grade_lab, labs or lab_names()))
    runs = [run for phases, _ in graded for run in phases]
    notes += [note for _, note in graded if note]
    records = [r for run in runs for r in run.records]
    collected = [n for run in runs for n in run.collected]
    if not collected:
        tail = "\n".join(run.output[-2000:] for run in runs)
        raise GradingRunError(f"pytest collected no lab test:\n{tail}")
    impls = [run.implementation for run in runs if run.implementation]
    return RunResult(
        exitstatus=max(run.exitstatus for run in runs),
        records=records,
        collected=collected,
        implementation=impls[0] if impls else "",
        output="\n".join(run.output for run in runs),
        problems=[p for run in runs for p in run.problems],
        notes=notes,
    )


def _defines_any(folder: Path, names: list[str]) -> bool:
    """True when a ``test_*.py`` of ``folder`` defines a function named in ``names``."""
    pattern = re.compile(r"^\s*(?:async\s+)?def\s+(%s)\s*\(" % "|".join(map(re.escape, names)),
                         re.MULTILINE)
    return any(pattern.search(f.read_text(errors="replace")) for f in folder.glob("test_*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


class _LabState:
    """What is known about one lab's tests across its (possibly restarted) test processes."""

    def __init__(self, lab: str, want: dict[str, dict] | None) -> None:
        self.lab = lab
        self.want = want  # node id -> metadata (points, doc, hidden); None until collected
        self.results: dict[str, dict] = {}
        self.failures: dict[str, str] = {}  # node id -> why it has no result
        self.known: set[str] = set()  # node ids some child collected (safe on a command line)
        self.problems: list[str] = []
        self.implementation = ""

    def absorb_collection(self, child: _Child) -> bool:
        """Takes in what a child collected; returns False when nothing more can run."""
        lab = self.lab
        if child.rejected:
            self.problems.append(f"{lab}: {child.rejected} line(s) of the grading log were "
                                 f"unsigned or forged and were ignored (something wrote to it)")
        collected = next((e for e in child.events if e.get("event") == "collected"), None)
        if collected is None:
            if self.want is None:
                raise GradingRunError(f"{lab}: the test process collected nothing "
                                      f"(exit {child.returncode}):\n{child.output[-3000:]}")
            if not self.known:  # a manifest expects tests this tree cannot even collect
                self.problems.append(f"{lab}: pytest could not collect the lab (exit "
                                     f"{child.returncode}): {child.output.strip()[-500:]}")
                for nid in self.want:
                    self.failures[nid] = (f"did not run: pytest could not collect {lab} (exit "
                                          f"{child.returncode}; a deleted or broken lab folder?)")
                return False
            return True
        self.implementation = self.implementation or collected.get("implementation", "")
        self.known.update(t["nodeid"] for t in collected["tests"])
        if self.want is None:
            self.want = {t["nodeid"]: t for t in collected["tests"]}
            return True
        for t in collected["tests"]:
            if t["nodeid"] in self.want:
                self.want[t["nodeid"]] = {**t, "points": self.want[t["nodeid"]]["points"]}
            else:
                self.problems.append(f"{lab}: {t['nodeid']} is not in the manifest (an added "
                                     f"test?); it is not graded")
        return True

    def absorb_events(self, child: _Child, test_timeout_s: float | None) -> bool:
        """Takes in the results; returns True when the child finished its session."""
        running = None
        for event in child.events:
            kind = event.get("event")
            if kind == "start":
                running = event["nodeid"]
            elif kind == "result":
                # Only the running test's result counts: a line for another test is out of turn.
                if event["nodeid"] == running:
                    self.results.setdefault(running, event)
                else:
                    self.problems.append(f"{self.lab}: ignored a result for {event['nodeid']} "
                                         f"logged while it was not running")
                running = None
            elif kind == "collect_error":
                self.problems.append(f"{self.lab}: collection error in {event['nodeid']}: "
                                     f"{event['message']}")
        if running is not None and running not in self.results:
            self.failures[running] = _death_message(child, test_timeout_s)
        return any(e.get("event") == "finish" for e in child.events)

    def remaining(self) -> list[str]:
        """Expected tests with neither a result nor a known failure."""
        return [n for n in self.want if n not in self.results and n not in self.failures]

    def records(self) -> list[TestResult]:
        """One graded record per expected test."""
        return [_record(nid, meta, self.results.get(nid), self.failures.get(nid), self.problems)
                for nid, meta in self.want.items()]


def _part(want: dict | None, hidden: bool) -> dict | None:
    """The expected tests of one phase: the hidden ones or the public ones (None: collect)."""
    if want is None:
        return None
    return {nid: pts for nid, pts in want.items()
            if is_hidden_path(REPO_ROOT / nid.split("::")[0]) == hidden}


def _private(folder: Path) -> None:
    """Makes a hidden-test folder (and ``hidden/`` above a bundle's) unreadable by any other
    user, the worker's included, when this process may (root, or the folder's owner)."""
    for path in (folder, folder.parent) if folder.parent.name == "hidden" else (folder,):
        try:
            path.chmod(path.stat().st_mode & ~0o077)
        except OSError:
            pass  # NOTE: not ours: the report still grades; see the README's threat model


def _run_lab(lab: str, *, paths, impl, env, only, extra_args, timeout_s, test_timeout_s,
             expected, progress) -> RunResult:
    """Runs one phase of a lab's tests (its public or its hidden ones) to the end, restarting
    the test process for the tests not yet run when one dies."""
    names = set(only or [])
    want = None
    if expected is not None:
        want = {nid: _meta(nid, lab, pts) for nid, pts in expected.items()
                if not names or _func_name(nid) in names}
    state = _LabState(lab, want)
    outputs, exitstatus, args, deaths = [], 0, paths, 0
    while True:
        child = _run_child(args, lab=lab, impl=impl, env=env, only=only, extra_args=extra_args,
                           timeout_s=timeout_s, test_timeout_s=test_timeout_s, progress=progress,
                           done=len(state.results) + len(state.failures),
                           total=len(state.want or {}))
        outputs.append(child.output[-4000:])
        exitstatus = max(exitstatus, child.returncode if child.returncode >= 0 else 128)
        if not state.absorb_collection(child):
            break
        finished = state.absorb_events(child, test_timeout_s)
        remaining = state.remaining()
        if finished or not remaining:
            break
        deaths += 1
        runnable = [n for n in remaining if n in state.known]
        if deaths > MAX_RESTARTS or not runnable:
            for nid in remaining:
                state.failures[nid] = (f"not run: the test process of {lab} died {deaths} times "
                                       f"({_how(child, test_timeout_s)}); tests that did not run "
                                       f"earn no points")
            break
        args = runnable  # a fresh process for the tests not yet run
    records = state.records()
    return RunResult(exitstatus, records, list(state.want), state.implementation,
                     f"== {lab}\n" + "\n".join(outputs), state.problems)


def _func_name(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def _meta(nodeid: str, lab: str, points: object) -> dict:
    return {"nodeid": nodeid, "lab": lab, "name": nodeid.split("::")[-1], "doc": "",
            "points": parse_points(points),
            "hidden": is_hidden_path(REPO_ROOT / nodeid.split("::")[0])}


def _record(nodeid: str, meta: dict, result: dict | None, failure: str | None,
            problems: list[str]) -> TestResult:
    # NOTE: what the grade rests on (points, hidden, lab) comes from the expected list, never
    # from the test process's result line.
    rec = TestResult(nodeid=nodeid, lab=meta["lab"], name=meta.get("name", ""),
                     doc=meta.get("doc", ""), points=parse_points(meta["points"]),
                     hidden=bool(meta.get("hidden")))
    if result is not None:
        try:
            logged = TestResult.from_json({k: v for k, v in result.items() if k != "event"})
        except ValueError as exc:
            rec.fail(f"the grading log's result for this test is malformed ({exc})")
            return rec
        rec.outcome, rec.when, rec.message = logged.outcome, logged.when, logged.message
        rec.details, rec.duration_s = logged.details, logged.duration_s
        rec.device = logged.device
        return rec
    if failure is None:
        path = nodeid.split("::")[0]
        why = next((p.split(": ", 2)[-1] for p in problems if f"collection error in {path}" in p),
                   None)
        failure = ("did not run: its test file failed to import: " + why if why else
                   "did not run: the test was not collected (deleted, renamed or broken test file?)")
    rec.fail(failure)
    return rec


def _how(child: _Child, test_timeout_s: float | None) -> str:
    if child.killed:
        return child.killed
    code = child.returncode
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} before the run finished"


def _death_message(child: _Child, test_timeout_s: float | None) -> str:
    how = _how(child, test_timeout_s)
    if child.killed and "timeout" in child.killed:
        return f"killed: {how} — stuck outside Python? (a hung kernel, an endless C loop)"
    return (f"the test process died while this test ran ({how}): os._exit, sys.exit in a "
            f"thread, a segfault or a kill — no points for a test that did not finish")


def _run_child(args: list[str], *, lab, impl, env, only, extra_args, timeout_s, test_timeout_s,
               progress, done, total) -> _Child:
    child_env = _child_env()
    if impl is not None:
        child_env["LAB_IMPL"] = impl
    child_env.update(env or {})
    how = child_env.get(ISOLATED_ENV)
    isolated = how in ("root", "sudo")
    homes = make_homes_folder() if isolated else None
    if homes is not None:
        child_env[HOMES_ENV] = str(homes)
    key = new_key()
    # NOTE: mkdtemp is private (0700) and unpredictable; the log is signed anyway.
    with tempfile.TemporaryDirectory(prefix="pagedlab-") as tmp:
        log, out_path = Path(tmp) / "log.jsonl", Path(tmp) / "output.txt"
        # Bytecode lives in a private, fresh folder: a committed __pycache__/*.pyc (an
        # "unchecked-hash" one is never compared with its source) is then never read.
        child_env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        # NOTE: -p no:nbval — grading runs no notebooks, and nbval's imports cost seconds per
        # child (nbformat -> jsonschema); every lab and every restart pays process start-up.
        # NOTE: -s: no user site-packages (a .pth there runs at start-up).
        cmd = [*python_argv("pytest", *args), "-q", "-p", "no:cacheprovider",
               "-p", "no:nbval",
               # NOTE: named here (it is also the root conftest's plugin) so its first hook runs
               # before any conftest is imported: the isolated worker starts earlier.
               "-p", "reference.grader.grading",
               "--pagedlab-log", str(log), "--rootdir", str(REPO_ROOT),
               "-c", str(REPO_ROOT / "pyproject.toml"), "--continue-on-collection-errors",
               # Only test_*.py is a test file: pytest's default also collects *_test.py, a
               # name a student could give a file of their own (with hooks in it).
               "-o", "python_files=test_*.py", "-o", "python_classes=Test*",
               "-o", "python_functions=test_*"]
        if test_timeout_s and importlib.util.find_spec("pytest_timeout") is not None:
            cmd += [f"--timeout={test_timeout_s:g}", "--timeout-method=signal"]
        if only:
            cmd += ["--pagedlab-only", ",".join(only)]
        cmd += extra_args or []
        read_fd = key_pipe(key)
        child_env[KEY_FD_ENV] = str(read_fd)
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=child_env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    pass_fds=(read_fd,), start_new_session=True)
        os.close(read_fd)
        tail = LogTail(log, key)
        try:
            events, killed = _watch(proc, tail, lab=lab, timeout_s=timeout_s,
                                    test_timeout_s=test_timeout_s, progress=progress, done=done,
                                    total=total)
        finally:
            _kill_group(proc)  # whatever the test process left behind (or on Ctrl-C)
            proc.wait()
            if isolated:
                # NOTE: and whatever student code left behind as the worker user (a daemon
                # that double-forked): it must not meet the next phase or submission; nor
                # must its homes (compiled kernels, anything it wrote there).
                kill_orphaned_worker_processes(how)
                remove_homes_folder(homes, how)
        events += tail.poll(final=True)
        output = out_path.read_text(errors="replace")
    return _Child(proc.returncode, killed, output, events, tail.rejected)


#: Variables of the grader's environment a test process never gets: CI's files for steering
#: later steps (a student's code appending PYTHONPATH to $GITHUB_ENV), pytest/Python start-up hooks.
DROPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONPATH",
               "PYTHONHOME", "PYTHONUSERBASE", "LD_PRELOAD", "LD_LIBRARY_PATH", "GITHUB_ENV",
               "GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_STATE", "GITHUB_STEP_SUMMARY",
               "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "GITHUB_TOKEN")


def _child_env() -> dict[str, str]:
    """Returns the test process's environment: the grader's, less :data:`DROPPED_ENV`."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _watch(proc: subprocess.Popen, tail: LogTail, *, lab, timeout_s, test_timeout_s, progress,
           done, total) -> tuple[list[dict], str | None]:
    """Waits for the child, reporting progress and killing it when a test or the lab overruns."""
    events: list[dict] = []
    start = time.monotonic()
    test_started: float | None = None
    hard_limit = test_timeout_s + KILL_GRACE_S if test_timeout_s else None
    while True:
        new = tail.poll()
        for event in new:
            kind = event.get("event")
            if kind == "collected" and not total:
                total = len(event["tests"])
            elif kind == "start":
                test_started = time.monotonic()
            elif kind == "result":
                test_started, done = None, done + 1
                if progress:
                    progress.update(lab, done, total)
        events += new
        if proc.poll() is not None:
            return events, None
        now = time.monotonic()
        if hard_limit and test_started is not None and now - test_started > hard_limit:
            _kill_group(proc)
            proc.wait()
            return events, f"past the per-test timeout of {test_timeout_s:g}s"
        if now - start > timeout_s:
            _kill_group(proc)
            proc.wait()
            return events, f"past the lab's time limit of {timeout_s:g}s"
        time.sleep(0.05)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
