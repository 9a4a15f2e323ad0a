"""The ``LAB_IMPL`` loader: which implementation of a lab the tests, notebooks and benchmarks use.

``LAB_IMPL=starter`` loads ``labs/<lab>/starter.py`` (the student's file), ``LAB_IMPL=solution``
loads ``solutions/<lab>/solution.py``. Unset, it is ``solution`` when ``solutions/`` exists and
``starter`` otherwise (a student release has no ``solutions/``). Any other value is an error.

NOTE: ``PAGEDLAB_IMPL_DIR`` is for the test-strength check only: it points at a folder holding a
*mutant* copy of a solution (``solution.py`` plus its ``.cu`` files). It overrides ``LAB_IMPL`` so
the same tests can be run against a deliberately broken implementation.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from reference.paths import LABS_DIR, SOLUTIONS_DIR

VALID_IMPLS = ("starter", "solution")
MUTANT_DIR_ENV = "PAGEDLAB_IMPL_DIR"


class LabImplError(RuntimeError):
    """LAB_IMPL names no implementation this checkout has."""


def default_impl() -> str:
    """Returns the implementation used when ``LAB_IMPL`` is unset."""
    return "solution" if SOLUTIONS_DIR.is_dir() else "starter"


def impl_name() -> str:
    """Returns the validated implementation name (``starter`` or ``solution``).

    Raises:
        LabImplError: ``LAB_IMPL`` is set to something else, or asks for ``solution`` in a
            checkout without ``solutions/``.
    """
    raw = os.environ.get("LAB_IMPL")
    if raw is None or raw.strip() == "":
        return default_impl()
    value = raw.strip()
    if value not in VALID_IMPLS:
        raise LabImplError(
            f"LAB_IMPL={raw!r} is not valid: use LAB_IMPL=starter (your code in labs/) or "
            f"LAB_IMPL=solution (the reference solutions in solutions/)."
        )
    if value == "solution" and not SOLUTIONS_DIR.is_dir():
        raise LabImplError(
            "LAB_IMPL=solution, but this checkout has no solutions/ folder (a student release): "
            "use LAB_IMPL=starter."
        )
    return value


def describe_impl() -> str:
    """Returns one line saying which implementation is under test, for headers and reports."""
    mutant_dir = os.environ.get(MUTANT_DIR_ENV)
    if mutant_dir:
        return f"mutant copy in {mutant_dir} ({MUTANT_DIR_ENV})"
    source = "LAB_IMPL" if os.environ.get("LAB_IMPL", "").strip() else "default"
    return f"LAB_IMPL={impl_name()} ({source})"


def impl_file(lab: str, impl: str | None = None) -> Path:
    """Returns the path of a lab's implementation file.

    Args:
        lab: lab folder name, e.g. ``"lab01_block_manager"``.
        impl: ``"starter"`` or ``"solution"``; None means :func:`impl_name`.

    Returns:
        ``labs/<lab>/starter.py`` or ``solutions/<lab>/solution.py``.
    """
    impl = impl or impl_name()
    if impl == "starter":
        return LABS_DIR / lab / "starter.py"
    return SOLUTIONS_DIR / lab / "solution.py"


def load_impl(lab: str, impl: str | None = None) -> ModuleType:
    """Imports a lab's implementation under a name unique to that lab and implementation.

    Args:
        lab: lab folder name, e.g. ``"lab01_block_manager"``.
        impl: ``"starter"`` or ``"solution"``; None honours ``LAB_IMPL`` (and the mutant override).

    Returns:
        The imported module (``labs.<lab>.starter`` or ``solutions.<lab>.solution``).

    Raises:
        LabImplError: unknown lab or invalid ``LAB_IMPL``.
    """
    if not (LABS_DIR / lab).is_dir():
        raise LabImplError(f"lab={lab!r} is not a folder under labs/")
    mutant_dir = os.environ.get(MUTANT_DIR_ENV)
    if impl is None and mutant_dir:
        return _load_from_dir(lab, Path(mutant_dir))
    impl = impl or impl_name()
    if impl not in VALID_IMPLS:
        raise LabImplError(f"impl={impl!r} is not one of {VALID_IMPLS}")
    if impl == "solution" and not SOLUTIONS_DIR.is_dir():
        raise LabImplError("impl='solution' but this checkout has no solutions/ folder")
    package = "labs" if impl == "starter" else "solutions"
    return importlib.import_module(f"{package}.{lab}.{impl}")


def _load_from_dir(lab: str, folder: Path) -> ModuleType:
    """Imports ``folder/solution.py`` as a package module, so relative imports and .cu files work."""
    package_name = f"_pagedlab_mutant_{lab}"
    module_name = f"{package_name}.solution"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_loader(package_name, loader=None, is_package=True)
    package = importlib.util.module_from_spec(spec)
    package.__path__ = [str(folder)]
    sys.modules[package_name] = package
    return importlib.import_module(module_name)
