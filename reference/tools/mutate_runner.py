"""A warm test runner for ``pagedlab mutate``: one pre-imported Python that forks per mutant.

A mutant's test run used to start a fresh interpreter: importing torch, NumPy, pytest and the
lab's given modules took about 4 s of the 5-12 s a run costs. The server below imports them
once, then for every request forks a child that runs ``pytest.main`` with the lab's usual
arguments and reports its exit status. The child starts from the server's clean state (the
server never runs a test and never loads the solution: the ``impl`` fixture loads it in the
child, from the mutated scratch copy), so runs cannot leak into each other.

The first request runs the tests in their usual order and records each test's duration;
later requests run the fastest tests first. Kill or survive does not depend on the order
(``-x`` stops at the first failure of the same set of tests), only the time to a kill does.

The client is what cosmic-ray runs as its test command. If the server cannot be reached it
runs the plain pytest command itself, so a dead server costs speed, never a wrong verdict.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import signal
import socket
import sys
from pathlib import Path

#: Loaded once in the server. NOTE: never the solution, a test module or a conftest: those
#: must be imported in each child, so that the child sees the mutant on disk.
PRELOAD = ("numpy", "torch", "pytest", "hypothesis", "_pytest.python", "reference.checks",
           "reference.loader", "reference.cuda", "reference.grader.grading")


def _preload(lab: str, repo_root: Path) -> None:
    """Imports what every run needs and fills the given helpers' argument-free caches.

    A given helper module's ``functools.lru_cache`` function without parameters (Lab 6's tiny
    model and its Hugging Face twin: seconds to build) is called once here, so every child
    starts with it built, as the second test of an ordinary run does.
    """
    import torch

    # NOTE: one thread before any torch work: a fork after an OpenMP pool started can hang.
    torch.set_num_threads(1)
    for name in PRELOAD:
        importlib.import_module(name)
    for path in sorted((repo_root / "labs" / lab).glob("_*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"labs.{lab}.{path.stem}")  # given code, never mutated
        for fn in vars(module).values():
            if (callable(fn) and hasattr(fn, "cache_info") and getattr(fn, "__module__", None)
                    == module.__name__ and not inspect.signature(fn).parameters):
                fn()


class _Durations:
    """pytest plugin: records each test's duration, or orders tests fastest first."""

    def __init__(self, known: dict[str, float] | None):
        self.known = known
        self.seen: dict[str, float] = {}

    def pytest_collection_modifyitems(self, items):
        if self.known is not None:
            items.sort(key=lambda item: self.known.get(item.nodeid, 0.0))

    def pytest_runtest_logreport(self, report):
        self.seen[report.nodeid] = self.seen.get(report.nodeid, 0.0) + report.duration


def _run_child(pytest_args: list[str], known: dict[str, float] | None, timeout: float,
               durations_file: Path | None) -> None:
    import pytest

    signal.alarm(int(timeout) + 5)  # cosmic-ray gives up on the client; the child must end too
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    plugin = _Durations(known)
    code = int(pytest.main(pytest_args, plugins=[plugin]))
    if durations_file is not None:
        durations_file.write_text(json.dumps(plugin.seen))
    os._exit(code)


def serve(sock_path: Path, lab: str, repo_root: Path, timeout: float, pytest_args: list[str]) -> None:
    """Answers each connection with the exit status of one forked pytest run.

    Args:
        sock_path: the Unix socket to listen on.
        lab: lab folder name (its given ``_*.py`` modules are preloaded).
        repo_root: the repository (the children's working directory).
        timeout: seconds after which a child kills itself.
        pytest_args: arguments for ``pytest.main``.
    """
    os.chdir(repo_root)
    _preload(lab, repo_root)
    durations_file = sock_path.with_name(sock_path.name + ".durations.json")
    known: dict[str, float] | None = None
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn:
            if conn.recv(16) == b"stop":
                return
            pid = os.fork()
            if pid == 0:
                server.close()
                _run_child(pytest_args, known, timeout, durations_file if known is None else None)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if known is None and code == 0 and durations_file.exists():
                known = json.loads(durations_file.read_text())
            try:
                conn.sendall(str(code if code >= 0 else 128 - code).encode())
            except OSError:
                pass  # the client timed out and is gone


def client(sock_path: Path, fallback: list[str]) -> int:
    """Asks the server for one run; runs ``fallback`` itself if no answer comes.

    Args:
        sock_path: the server's socket.
        fallback: the plain test command.

    Returns:
        The tests' exit status.
    """
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(sock_path))
            conn.sendall(b"run")
            answer = conn.recv(16)
        if answer:
            return int(answer)
    except OSError:
        pass
    os.execv(fallback[0], fallback)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["serve", "client"])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--lab", default="")
    parser.add_argument("--timeout", type=float, default=120.0)
    # After "--": pytest's arguments (serve) or the fallback command (client).
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if args.role == "serve":
        serve(args.socket, args.lab, Path.cwd(), args.timeout, rest)
        return 0
    return client(args.socket, rest)


if __name__ == "__main__":
    sys.exit(main())
