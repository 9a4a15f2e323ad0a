"""Notebook helpers: a cell that reaches an unfinished ``TODO`` says so in one line.

In a student release the notebooks run the student's starter (``LAB_IMPL`` defaults to
``starter``). A cell that calls an unfinished function would end in a ``NotImplementedError``
traceback; with these helpers it prints which ``TODO`` it needs instead, and (inside
:func:`student_code`) the notebook runs on, so cells that only read the committed measurements
still show them.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from reference.loader import describe_impl


def todo_line(exc: BaseException, lab: str | None = None) -> str | None:
    """Returns the one-line message for a starter's ``TODO``, or None for any other error.

    Args:
        exc: the exception a cell raised.
        lab: lab folder name, e.g. ``"lab04_decode_kernels"``, to name the file to edit.

    Returns:
        ``"This cell runs your code (...): it needs TODO(labN.k) ..."``, or None when ``exc``
        is not a starter's ``NotImplementedError("TODO(...)")``.
    """
    text = str(exc)
    if not isinstance(exc, NotImplementedError) or not text.startswith("TODO("):
        return None
    where = f" in labs/{lab}/starter.py" if lab else ""
    return (f"This cell runs your code ({describe_impl()}): it needs {text.splitlines()[0]}"
            f"{where} first. Finish that task and run the cell again.")


@contextlib.contextmanager
def student_code(lab: str) -> Iterator[None]:
    """Runs the body; an unfinished ``TODO`` ends it with one printed line instead of raising.

    Args:
        lab: lab folder name whose code the body calls, e.g. ``"lab05_prefill_kernels"``.

    Yields:
        Nothing; any other exception propagates unchanged.
    """
    try:
        yield
    except NotImplementedError as exc:
        line = todo_line(exc, lab)
        if line is None:
            raise
        print(line)


def brief_todo_errors() -> None:
    """Makes IPython show a starter's ``TODO`` error as one line instead of a traceback.

    NOTE: the cell still fails (so "Run All" stops where the lab's code is needed); only the
    traceback is replaced. Outside IPython this does nothing.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def _handler(shell, etype, value, tb, tb_offset=None):
        # NOTE: IPython ignores what a custom handler returns when user code raised: the
        # handler shows the error itself (showtraceback is the usual path, not this handler).
        line = todo_line(value)
        if line is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return []
        # NOTE: the line goes out as the cell's *error* output (a one-line traceback), not as
        # print(): nbval (`pytest --nbval-lax`) fails a cell only on an error output, and a
        # printed line let the TODO cell pass while the cells after it failed with NameError.
        shell._showtraceback(etype, value, [line])
        return [line]

    shell.set_custom_exc((NotImplementedError,), _handler)
