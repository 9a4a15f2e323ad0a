"""Root pytest configuration for the workbook.

* Loads the grading plugin (points marker, grade table, JSON report): ``reference.grader.grading``.
* Loads ``reference.capability_skip``: on a GPU below compute capability 8.0 (a T4), a test of
  a stage that needs sm_80 skips with the reason instead of failing.
* Loads ``reference.context_lost``: once a kernel loses the process's CUDA context, the failures
  after it name the test where it was lost instead of looking like bugs of their own.
* Provides the ``impl`` fixture: the implementation of the lab a test lives in, chosen by
  ``LAB_IMPL`` (see ``reference/loader.py``). Tests never import ``starter``/``solution``.
  Under isolated grading (``PAGEDLAB_ISOLATED`` set) it is a proxy for that module, which lives
  in an unprivileged worker process (``reference/grader/proxy.py``).
* Makes hypothesis deterministic, so a grade never depends on a lucky draw.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from reference.grader.sandbox import ISOLATED_ENV
from reference.loader import MUTANT_DIR_ENV, load_impl
from reference.paths import lab_of_path

pytest_plugins = ["reference.grader.grading", "reference.capability_skip", "reference.context_lost"]

# Grading must be reproducible: the same code gets the same examples on every run and machine.
settings.register_profile(
    "pagedlab",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A mutant run (the test-strength check) only needs to know *that* a test fails, not the
# smallest failing example: skipping hypothesis's shrink phase there saves tens of seconds a mutant.
settings.register_profile(
    "pagedlab-mutant",
    parent=settings.get_profile("pagedlab"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile("pagedlab-mutant" if os.environ.get(MUTANT_DIR_ENV) else "pagedlab")


@pytest.fixture
def impl(request: pytest.FixtureRequest):
    """The module under test for this test's lab (starter, solution or a mutant copy).

    NOTE: loading happens here, not at import time, so a student's broken ``starter.py`` fails
    each test with its own error instead of breaking collection of the whole suite.
    """
    lab = lab_of_path(request.node.path)
    if lab is None:
        raise RuntimeError(f"{request.node.nodeid} is not inside labs/<lab>/; use load_impl()")
    if os.environ.get(ISOLATED_ENV):
        # Grading: student code runs only in a worker process (reference/grader/proxy.py).
        from reference.grader.proxy import remote_impl

        return remote_impl(lab)
    return load_impl(lab)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--fuzz-examples N``: examples per test of the bad-input fuzz suite (``tests/fuzz``)."""
    parser.addoption("--fuzz-examples", type=int, default=None,
                     help="examples per fuzz test (default 120; env PAGEDLAB_FUZZ_EXAMPLES)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "emulated: a kernel test that runs on the emulated device (reference/emulate.py) "
        "when PAGEDLAB_DEVICE=emulate is set")
    n = config.getoption("--fuzz-examples", default=None)
    if n is not None:
        os.environ["PAGEDLAB_FUZZ_EXAMPLES"] = str(n)


@pytest.fixture(autouse=True)
def _emulated_device(request: pytest.FixtureRequest):
    """With PAGEDLAB_DEVICE=emulate, kernels run emulated inside tests marked ``emulated`` and
    nowhere else (the validation tests keep proving that CPU tensors are refused)."""
    from reference.gpu import emulation_requested

    if not emulation_requested():
        yield
        return
    from reference.emulate import emulation

    with emulation(request.node.get_closest_marker("emulated") is not None):
        yield
