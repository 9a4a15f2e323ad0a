"""A test helper the labs share: "this call must raise this error, naming this argument"."""

from __future__ import annotations

from typing import Any, Callable


def raises_naming(call: Callable[[], Any], error: type[BaseException], name: str | None,
                  what: str, crashed_hint: str = "", accepted_hint: str = "") -> None:
    """Asserts that ``call()`` raises ``error`` with ``name`` in its message.

    An untouched starter's ``NotImplementedError`` goes through as itself (the test then fails
    with the TODO, never with a misleading message).

    Args:
        call: the call under test, with no arguments.
        error: the exception class the docstring or handout promises.
        name: the argument the message must name (None: any message).
        what: what was tried, first in every failure message.
        crashed_hint: appended when another exception comes out (the likely mistake).
        accepted_hint: appended when nothing is raised.
    """
    import pytest

    expected = error.__name__ if name is None else f"{error.__name__} naming {name}"
    try:
        call()
    except error as exc:
        assert name is None or name in str(exc), f"{what}: {exc!r} does not name {name}"
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 — the message says which
        pytest.fail(f"{what}: expected {expected}, got {exc!r}{crashed_hint}")
    pytest.fail(f"{what}: accepted; expected {expected}{accepted_hint}")
