"""Pytest plugin: a test of a stage the visible GPU is too old for skips, with the reason.

On a GPU below compute capability 8.0 (a Colab or Kaggle T4 is 7.5), loading a stage that uses
``mma.sync`` m16n8k16, ``ldmatrix`` or ``cp.async`` raises :class:`ComputeCapabilityError`
(``reference.cuda.check_capability``, before anything compiles). A test that meets it there
cannot say anything about the student's kernel, so it skips: "needs compute capability 8.0
(this GPU is 7.5)". The decision rests on the *live* device, never on the error alone: on an
sm_80+ GPU (or the emulated device, which runs every stage) the same error is a bug — e.g. a
student's code raising it itself — and the test fails as usual.

Loaded by the root ``conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import pytest

from reference.errors import ComputeCapabilityError


def _live_capability() -> tuple[int, int] | None:
    """The visible GPU's compute capability, or None off a GPU (and under emulation)."""
    from reference import cuda as rcuda

    if rcuda.emulating():
        return None
    try:
        return tuple(rcuda.device_capability())
    except Exception:  # noqa: BLE001 — no CUDA device, or torch without CUDA: not a GPU here
        return None


def capability_skip_reason(exc: BaseException) -> str | None:
    """Why a test that raised ``exc`` should skip rather than fail, or None when it should fail.

    Args:
        exc: what the test raised.

    Returns:
        ``"needs compute capability 8.0 (this GPU is 7.5): <the error>"`` when ``exc`` is a
        :class:`ComputeCapabilityError` and the visible GPU really is below what it names; None
        otherwise (another error, an sm_80+ GPU, no GPU, the emulated device).
    """
    if not isinstance(exc, ComputeCapabilityError):
        return None
    have = _live_capability()
    try:
        need = tuple(int(p) for p in str(exc.required).split("."))
    except (AttributeError, ValueError):
        return None
    if have is None or have >= need:
        return None
    return (f"needs compute capability {exc.required} (this GPU is {have[0]}.{have[1]}): "
            f"{exc}")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Turns a ComputeCapabilityError on a too-old GPU into a skip (see the module)."""
    try:
        return (yield)
    except ComputeCapabilityError as exc:
        reason = capability_skip_reason(exc)
        if reason is None:
            raise
        pytest.skip(reason)
