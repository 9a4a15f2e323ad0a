"""Pytest plugin: once a kernel loses the process's CUDA context, later failures say so.

An illegal address, a trap or a launch failure in a kernel is *sticky*: every CUDA call the
process makes afterwards fails with the same error. In one pytest process, the tests after the
faulting one then fail with "an illegal memory access was encountered" in their own setup,
whatever the code they test — and a student reads that as a bug in each of those stages.

This plugin finds the first failing test after which the context is gone and adds a note to it
("this test's kernel lost the CUDA context"); every later failure gets a note naming that test,
which also becomes its one-line message in the grade table. Nothing changes while the context
is healthy, and nothing changes off a GPU (the emulated device has no sticky errors).

NOTE: graded isolated, student kernels run in the worker, which exits after such a call
(:mod:`reference.grader.worker`): the next test gets a fresh context, so no note is needed there.

Loaded by the root ``conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import pytest

from reference.gpu import cuda_context_lost

#: The node id of the test after which this process's CUDA context was found lost.
_LOST_AFTER: list[str] = []

#: How the one-line message of a failure caused by an earlier test's lost context begins.
NOT_OWN_FAILURE = "not this test's own failure"


def is_own_failure(message: str) -> bool:
    """False for a failure this plugin marked as caused by an earlier test's lost context.

    Args:
        message: a failed test's one-line message (the grading record's ``message``).

    Returns:
        False when the message begins with :data:`NOT_OWN_FAILURE` (with or without the
        ``NOTE:`` of a report that had no crash line); True otherwise.
    """
    return not message.removeprefix("NOTE: ").startswith(NOT_OWN_FAILURE)


def lost_context_note(nodeid: str, lost_after: str) -> str:
    """The note for a failing test, given the test after which the context was lost.

    Args:
        nodeid: the failing test.
        lost_after: the first failing test after which the CUDA context was gone.

    Returns:
        One line: for ``lost_after`` itself, that its kernel lost the context; for a later test,
        that it failed because of that earlier test and how to run it alone.
    """
    if nodeid == lost_after:
        return ("NOTE: the CUDA context of this process was lost when this test failed (an "
                "illegal address, a trap or a launch failure in a kernel it ran, or one an "
                "earlier test left running): every later CUDA call in this process fails, so the "
                "tests after it fail too until this is fixed")
    path, _, name = nodeid.partition("::")
    return (f"NOTE: {NOT_OWN_FAILURE}: the CUDA context was lost in an earlier test, "
            f"{lost_after}; fix that one first, or run this test alone: "
            f"pytest '{path}::{name}'")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Adds the lost-context note to a failing test's report (see the module)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    if not _LOST_AFTER:
        if not cuda_context_lost():
            return
        _LOST_AFTER.append(item.nodeid)
        report.sections.append(("CUDA context lost", lost_context_note(item.nodeid, item.nodeid)))
        return
    note = lost_context_note(item.nodeid, _LOST_AFTER[0])
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None) is not None:
        # NOTE: the crash line is the test's one-line message (pytest's summary, the grade
        # table); the traceback stays as it was.
        crash.message = f"{note.split(': ', 1)[1].split(';')[0]} — {crash.message}"
        report.sections.append(("CUDA context lost", note))
    else:
        report.longrepr = f"{report.longreprtext}\n\n{note}"  # its last line is the message
