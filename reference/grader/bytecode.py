"""Which bytecode a grading process may read: never the graded tree's, always the installation's.

A ``__pycache__/*.pyc`` committed in a submission is never compared with its source when it is
an "unchecked-hash" one (and a timestamp one carries the very mtime and size it is checked
against), so grading processes keep the graded tree's bytecode in a private, fresh
``PYTHONPYCACHEPREFIX`` folder. That folder used to hold *every* module's bytecode, and with
bytecode writing off each test process and each worker compiled torch, numpy and pytest from
source at start-up (about 3 CPU seconds for ``import torch`` alone on the 2-core CI machine, in
each of the hundreds of processes a CI run starts). :func:`python_argv` starts Python with a
small bootstrap (passed inline, so no file of the graded tree runs before it) that sends the
bytecode lookups of installed modules back to their own ``__pycache__``: the interpreter's
library and the environment's site-packages, which pip compiled at install.
"""

from __future__ import annotations

import sys

# NOTE: a string the grader hands over with -c, not a module file: the graded tree (where this
# file lives) may be a student's, and nothing from it may run before the lookups are redirected.
# Installed means under the interpreter's or the environment's prefix (a .venv inside a clone
# too: its sources are as much the submission's as its bytecode); everything else — the graded
# tree, a mutant's copy — reads bytecode only from the private PYTHONPYCACHEPREFIX folder.
BOOT = r"""
import os, sys, runpy
import importlib._bootstrap_external as _external
_installed = tuple({os.path.join(f(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                    sys.base_exec_prefix) for f in (os.path.abspath, os.path.realpath)})
_from_source = _external.cache_from_source
def _cache_from_source(path, debug_override=None, *, optimization=None):
    cached = _from_source(path, debug_override, optimization=optimization)
    if sys.pycache_prefix and path.startswith(_installed):
        return os.path.join(os.path.dirname(path), "__pycache__", os.path.basename(cached))
    return cached
_external.cache_from_source = _cache_from_source
# NOTE: -c leaves '' (whatever folder is current later) where -m puts the start folder itself.
if sys.path and sys.path[0] == "":
    sys.path[0] = os.getcwd()
_module = sys.argv[1]
sys.argv = [_module, *sys.argv[2:]]
runpy.run_module(_module, run_name="__main__", alter_sys=True)
"""


def python_argv(module: str, *args: str) -> list[str]:
    """The command that runs ``python -s -m module args`` with :data:`BOOT` first.

    Args:
        module: the module to run as ``__main__``.
        *args: its arguments.

    Returns:
        An argv for :class:`subprocess.Popen`.
    """
    return [sys.executable, "-s", "-c", BOOT, module, *args]
