"""Grading processes read no bytecode of the graded tree, and the installation's as usual
(reference/grader/bytecode.py)."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys

from reference.grader.bytecode import python_argv


def test_graded_tree_bytecode_is_never_read_but_installed_bytecode_is(tmp_path):
    """A module outside the installation runs from its source even when a committed
    unchecked-hash ``__pycache__`` says otherwise; a standard-library module's bytecode is looked
    up in its own ``__pycache__``, not in the private prefix folder."""
    graded = tmp_path / "graded"
    graded.mkdir()
    (graded / "verdict.py").write_text("ANSWER = 'source'\n")
    fake = tmp_path / "fake.py"
    fake.write_text("ANSWER = 'planted bytecode'\n")
    planted = graded / "__pycache__" / f"verdict.{sys.implementation.cache_tag}.pyc"
    planted.parent.mkdir()
    py_compile.compile(str(fake), cfile=str(planted),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    (graded / "probe.py").write_text(
        "import json, verdict\n"
        "print(verdict.ANSWER)\n"
        "print(verdict.__cached__)\n"
        "print(json.__cached__)\n")
    prefix = tmp_path / "prefix"
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(python_argv("probe"), cwd=graded, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answer, verdict_cached, json_cached = proc.stdout.split()
    assert answer == "source", "a committed __pycache__ of the graded tree was read"
    assert verdict_cached.startswith(str(prefix)), verdict_cached
    assert f"{os.sep}__pycache__{os.sep}" in json_cached, json_cached
    assert not json_cached.startswith(str(prefix)), f"installed bytecode not read: {json_cached}"


def test_the_module_runs_as_main_with_its_arguments(tmp_path):
    """``python_argv(module, *args)`` behaves as ``python -s -m module args``: the arguments, and
    the start folder itself (not ``''``, which would follow a later chdir) first on sys.path."""
    (tmp_path / "echo_args.py").write_text(
        "import sys\nif __name__ == '__main__':\n    print(sys.argv[1:], sys.path[0])\n")
    proc = subprocess.run(python_argv("echo_args", "a", "--b"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"['a', '--b'] {tmp_path}"
