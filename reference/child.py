"""A child process that imports the implementation under test.

A few tests need student code in a process of its own: Lab 1 hashes in processes started with
other ``PYTHONHASHSEED`` values, Labs 4 and 5 run kernels under compute-sanitizer. Such a child
is a call into student code like any other, so graded isolated (``PAGEDLAB_ISOLATED`` set in the
test's process) it runs as the worker user, with the worker's environment and home (the live
worker's, else a fresh one); the test's process only reads what it printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

from reference.paths import REPO_ROOT


#: Output kept per stream; a child that writes more is killed (student code can flood it).
MAX_OUTPUT_BYTES = 4 << 20


def run_with_implementation(argv: list[str], *, env: dict[str, str] | None = None,
                            timeout: float) -> subprocess.CompletedProcess:
    """Runs ``argv`` from the repository root, with the workbook on ``PYTHONPATH``.

    Args:
        argv: the command; its Python loads the implementation (``reference.loader.load_impl``).
        env: variables to add (e.g. ``PYTHONHASHSEED``).
        timeout: seconds before it is killed (``subprocess.TimeoutExpired``).

    Returns:
        The finished process, stdout and stderr as text (at most MAX_OUTPUT_BYTES each: past
        that the child is killed and its return code is the kill's).
    """
    from reference.grader.sandbox import FORWARDED_ENV, ISOLATED_ENV, make_worker_home, worker_argv

    how = os.environ.get(ISOLATED_ENV)
    if how in ("root", "sudo"):
        from reference.grader.proxy import live_worker_home

        # NOTE: the test's worker's home when one is alive: the same user, and its CuPy cache
        # holds the kernels already compiled (a fresh home compiles all of them again, inside
        # the test's time limit).
        shared = live_worker_home()
        home = shared or make_worker_home()
        try:
            # NOTE: the variables a test may change for student code (PAGEDLAB_DEBUG) reach the
            # child as they reach the worker's calls.
            forwarded = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
            command, extra = worker_argv(argv, how, home, **{**forwarded, **(env or {})},
                                         PYTHONPATH=str(REPO_ROOT))
            return _run_capped(command, None, timeout, extra, how)
        finally:
            if shared is None:
                shutil.rmtree(home, ignore_errors=True)
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full.get("PYTHONPATH")]))
    return _run_capped(argv, full, timeout, {}, None)


def _run_capped(argv: list[str], env: dict[str, str] | None, timeout: float, extra: dict,
                how: str | None) -> subprocess.CompletedProcess:
    """subprocess.run with each output stream read into at most MAX_OUTPUT_BYTES; the child
    runs in a process group of its own, killed whole on a timeout or a flood (``how``: the
    worker's ``root`` / ``sudo``, or None for this user)."""
    from reference.grader.sandbox import kill_process_group

    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, **extra)
    chunks: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}

    def kill_group() -> None:
        kill_process_group(proc.pid, how)

    def drain(stream, key: str) -> None:
        for block in iter(lambda: stream.read1(65536), b""):
            if len(chunks[key]) < MAX_OUTPUT_BYTES:
                chunks[key] += block[:MAX_OUTPUT_BYTES - len(chunks[key])]
            else:
                kill_group()  # NOTE: keep reading until EOF, so nothing blocks on a full pipe

    readers = [threading.Thread(target=drain, args=(proc.stdout, "out"), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, "err"), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.wait()
        raise
    finally:
        # NOTE: a process the child left in its group would hold the pipes open: kill the
        # group, then give both readers one shared deadline.
        kill_group()
        deadline = time.monotonic() + 5
        for reader in readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
        proc.stdout.close()
        proc.stderr.close()
    return subprocess.CompletedProcess(argv, code, chunks["out"].decode(errors="replace"),
                                       chunks["err"].decode(errors="replace"))
