"""Pytest plugin: points on every lab test, a per-lab grade table, and a JSON report.

Loaded by the root ``conftest.py``. It

* registers the ``points(n)`` marker and refuses to run a lab test without exactly one (and an
  infrastructure test with one: only lab tests are graded);
* records each test's outcome, points and failure message;
* prints the grade table at the end of a run that touched lab tests;
* writes the raw report with ``--pagedlab-report PATH`` (what ``pagedlab grade`` and
  ``pagedlab check`` read, so grading never parses terminal output);
* ``--pagedlab-only name1,name2`` keeps only tests with those function names (the mutant check
  runs just the tests a mutant is declared to be caught by);
* ``--pagedlab-first-failure`` skips a test function's later cases once one failed in its
  body (the mutant check: a mutant is caught by a test when any case fails; the rest would
  only cost time, minutes of emulated kernels in CI);
* ``--pagedlab-log PATH`` appends signed events as the run goes (the tests collected, each
  test's start and result, the end of the session): what :mod:`reference.grader.runner` grades from,
  so a test process that dies mid-run still leaves a usable, checkable record
  (:mod:`reference.grader.signed_log`).
"""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path

import pytest

from reference.loader import LabImplError, describe_impl, impl_name
from reference.paths import is_hidden_path, lab_of_path
from reference.grader.results import TestResult, points_json
from reference.grader.sandbox import ISOLATED_ENV
from reference.grader.signed_log import LogWriter, take_key_from_env

#: Longest failure text kept per test (Gradescope shows it to the student).
MAX_DETAILS_CHARS = 4000

# NOTE: pytest_runtest_logreport gets no config argument; the active config is kept here.
_CONFIG: dict = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedlab")
    group.addoption("--pagedlab-report", default=None, help="write the graded JSON report here")
    group.addoption(
        "--pagedlab-only", default=None, help="comma-separated test function names to keep"
    )
    group.addoption("--pagedlab-log", default=None,
                    help="append signed grading events here as the run goes (for the grader)")
    group.addoption("--pagedlab-first-failure", action="store_true",
                    help="skip a test function's later cases once one of its cases failed "
                         "(the mutant check needs one failure per test, not all of them)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Grading isolated, starts the lab's worker before the lab's ``conftest.py`` is imported
    (Labs 2, 4-6 import torch there: seconds the worker's own start now overlaps).

    NOTE: pytest calls this only for plugins named with ``-p`` (the runner does); loaded
    through the root ``conftest.py``, the worker starts at ``pytest_configure`` instead.
    """
    _prestart_worker(args)


def _prestart_worker(args) -> None:
    if os.environ.get(ISOLATED_ENV):
        from reference.grader.proxy import prestart_for_args

        prestart_for_args(args)  # NOTE: once: a second call finds the worker started


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "points(n): points this lab test is worth when graded")
    try:
        impl_name()
    except LabImplError as exc:
        raise pytest.UsageError(str(exc)) from None
    # Grading isolated: the lab's worker starts now, while this process collects (unless the
    # first hook above started it already).
    _prestart_worker(config.args)
    config._pagedlab_records = {}  # nodeid -> TestResult
    config._pagedlab_called = set()  # nodeids whose test body ran and passed its call phase
    config._pagedlab_failed_functions = set()  # (path, function) with a case failed in its body
    log_path = config.getoption("--pagedlab-log")
    if log_path:
        # Take the key now: no student code has been imported yet (impl loads in a fixture).
        writer = LogWriter(log_path, take_key_from_env())
        config.pluginmanager.register(_log_plugin(config, writer.write), "pagedlab-log")
    _CONFIG["config"] = config


class _HookHolder:
    """A plugin object for pluggy: hooks as attributes, hashable by identity.

    NOTE: not a ``types.SimpleNamespace``: that defines ``__eq__`` and so is unhashable, and
    pytest puts plugins in sets as soon as a lab folder has its own ``conftest.py``.
    """


def _log_plugin(config: pytest.Config, log) -> _HookHolder:
    """Returns the hooks that write the grading log.

    NOTE: the writer lives only in these closures — not on ``config`` nor in a module global —
    so student code cannot reach it by name; reaching it takes walking pytest's internals.
    """
    records = config._pagedlab_records
    called = config._pagedlab_called

    def pytest_collectreport(report: pytest.CollectReport) -> None:
        if report.failed:
            log({"event": "collect_error", "nodeid": report.nodeid,
                 "message": _short_message(report)[:MAX_DETAILS_CHARS]})

    def pytest_collection_finish(session: pytest.Session) -> None:
        # What this process will run (after -k/-m/--pagedlab-only): the expected list.
        tests = [records[it.nodeid].to_json() for it in session.items if it.nodeid in records]
        log({"event": "collected", "implementation": describe_impl(), "tests": tests})

    def pytest_runtest_logstart(nodeid: str, location) -> None:
        if nodeid in records:
            log({"event": "start", "nodeid": nodeid})

    def pytest_runtest_logfinish(nodeid: str, location) -> None:
        rec = records.get(nodeid)
        if rec is None:
            return
        body = rec.to_json()
        if rec.passed and nodeid not in called:
            body.update(outcome="error", message="the test body never ran")
        log({"event": "result", **body})

    def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
        log({"event": "finish", "exitstatus": int(exitstatus)})

    hooks = (pytest_collectreport, pytest_collection_finish, pytest_runtest_logstart,
             pytest_runtest_logfinish, pytest_sessionfinish)
    plugin = _HookHolder()
    for hook in hooks:
        setattr(plugin, hook.__name__, hook)
    return plugin


def pytest_report_header(config: pytest.Config) -> str:
    return f"pagedlab: implementation under test: {describe_impl()}"


def _points_of(item: pytest.Item) -> list[float]:
    return [m.args[0] if m.args else None for m in item.iter_markers(name="points")]


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection: points are shared over all cases
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    problems = []
    for item in items:
        lab = lab_of_path(item.path)
        points = _points_of(item)
        if lab is None:
            if points:
                problems.append(f"{item.nodeid}: infrastructure tests carry no points")
            continue
        if len(points) != 1:
            problems.append(f"{item.nodeid}: a lab test needs exactly one @pytest.mark.points(n)")
        elif isinstance(points[0], bool) or not isinstance(points[0], int) or points[0] <= 0:
            problems.append(f"{item.nodeid}: points must be a positive whole number, "
                            f"got {points[0]!r}")
    if problems:
        raise pytest.UsageError("pagedlab grading markers:\n  " + "\n  ".join(problems))

    # points(n) is what the test *function* is worth: its parametrized cases share n equally.
    cases: dict[tuple, int] = {}
    for item in items:
        key = (str(item.path), getattr(item, "originalname", item.name))
        cases[key] = cases.get(key, 0) + 1

    records = config._pagedlab_records
    for item in items:
        lab = lab_of_path(item.path)
        if lab is None:
            continue
        share = cases[(str(item.path), getattr(item, "originalname", item.name))]
        # The docstring's first paragraph states the property the test proves.
        doc = (getattr(item.function, "__doc__", None) or "").strip().split("\n\n")[0].split()
        records[item.nodeid] = TestResult(
            nodeid=item.nodeid,
            lab=lab,
            name=item.name,
            doc=" ".join(doc),
            points=Fraction(_points_of(item)[0], share),  # exact: the cases add up to n
            hidden=is_hidden_path(item.path),
            device="emulated" if _runs_emulated(item) else "",
        )

    only = config.getoption("--pagedlab-only")
    if only:
        names = {n.strip() for n in only.split(",") if n.strip()}
        kept = [it for it in items if getattr(it, "originalname", it.name) in names]
        config.hook.pytest_deselected(items=[it for it in items if it not in kept])
        items[:] = kept


def _runs_emulated(item) -> bool:
    from reference.gpu import emulation_requested

    return item.get_closest_marker("emulated") is not None and emulation_requested()


def _short_message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return crash.message
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # skip: (path, line, reason)
        return str(report.longrepr[2])
    text = str(report.longrepr or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


#: user_properties key carrying a test's grading metadata from an xdist worker to the controller.
XDIST_PROPERTY = "pagedlab_test"


def _function_key(item: pytest.Item) -> tuple[str, str]:
    return str(item.path), getattr(item, "originalname", item.name)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.getoption("--pagedlab-first-failure") \
            and _function_key(item) in item.config._pagedlab_failed_functions:
        pytest.skip("--pagedlab-first-failure: an earlier case of this test failed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and report.failed:
        item.config._pagedlab_failed_functions.add(_function_key(item))
    rec = item.config._pagedlab_records.get(item.nodeid)
    if rec is not None and call.when == "setup":
        # NOTE: under pytest-xdist the controller never collects; it learns each test's points
        # and lab from its setup report, so the grade table of `pytest -n auto` stays whole.
        meta = TestResult(nodeid=rec.nodeid, lab=rec.lab, name=rec.name, doc=rec.doc,
                          points=rec.points, hidden=rec.hidden)
        report.user_properties.append((XDIST_PROPERTY, meta.to_json()))


def _record_for(config: pytest.Config, report: pytest.TestReport) -> TestResult | None:
    records = config._pagedlab_records
    rec = records.get(report.nodeid)
    if rec is None and getattr(config, "workerinput", None) is None:  # an xdist controller
        meta = next((v for k, v in report.user_properties if k == XDIST_PROPERTY), None)
        if meta is not None:
            rec = records[report.nodeid] = TestResult.from_json(meta)
    return rec


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    rec = _record_for(config, report)
    if rec is None:
        return
    rec.duration_s += report.duration
    if rec.failed:
        return  # the first non-pass decides
    if report.failed:
        rec.outcome = "failed" if report.when == "call" else "error"
        rec.when = report.when
        rec.message = _short_message(report)
        rec.details = report.longreprtext[-MAX_DETAILS_CHARS:]
    elif report.skipped and rec.outcome == "passed":
        rec.outcome = "skipped"
        rec.when = report.when
        rec.message = _short_message(report).removeprefix("Skipped: ")
    elif report.when == "call" and report.passed:
        config._pagedlab_called.add(report.nodeid)


def _finished_records(config: pytest.Config) -> list[TestResult]:
    out = []
    for rec in config._pagedlab_records.values():
        if rec.passed and rec.nodeid not in config._pagedlab_called:
            continue  # deselected or never ran (e.g. -x stopped early)
        out.append(rec)
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    path = config.getoption("--pagedlab-report")
    if not path:
        return
    records = _finished_records(config)
    payload = {
        "implementation": describe_impl(),
        "exitstatus": int(exitstatus),
        "collected": [r.nodeid for r in config._pagedlab_records.values()],
        "points": {r.nodeid: points_json(r.points) for r in config._pagedlab_records.values()},
        "tests": [r.to_json() for r in records],
    }
    Path(path).write_text(json.dumps(payload, indent=1))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from reference.grader.gradebook import format_table, summarize

    records = _finished_records(config)
    if not records:
        return
    rows = summarize(records)
    terminalreporter.section("pagedlab grade")
    terminalreporter.write_line(f"implementation: {describe_impl()}")
    emulated = sum(1 for r in records if r.device == "emulated" and r.outcome != "skipped")
    if emulated:
        terminalreporter.write_line(f"{emulated} kernel tests ran on the emulated device "
                                    "(PAGEDLAB_DEVICE=emulate): correctness, not speed")
    for line in format_table(rows).splitlines():
        terminalreporter.write_line(line)
