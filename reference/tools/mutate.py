"""``pagedlab mutate <lab>``: systematic mutation testing of a lab's solution with cosmic-ray.

Hand mutants (``solutions/<lab>/mutants/*.toml``) are the mistakes somebody thought of. This
command asks a tool for the rest: cosmic-ray rewrites the solution one small change at a time
(``<`` for ``<=``, ``+`` for ``-``, a number off by one, a loop that never runs, ...) and runs
*only that lab's* tests — public and hidden — against each copy. A mutant the tests do not fail
*survives*; each survivor must be killed by a new test or listed as *equivalent* (no observable
behaviour changes) with a one-line reason in ``solutions/<lab>/mutants/equivalent.json``.

The result goes to ``solutions/<lab>/mutation.json``: date, tool and version, the command, the
SHA-256 of the solution it was run on, counts, and every mutant's outcome (survivors and
equivalents with their reasons). ``tests/test_mutation_results.py`` checks in CI that the
committed result is for the current solution — the run itself is too slow for CI.

Why cosmic-ray and not mutmut: our tests never import the solution as a package; they load
``solution.py`` from a folder (``PAGEDLAB_IMPL_DIR``, the mechanism hand mutants use).
cosmic-ray mutates a file on disk and runs any shell command, so it mutates a scratch copy of
the lab and points ``PAGEDLAB_IMPL_DIR`` at it: the working tree is never touched and the tests
run exactly as graded. mutmut 3 instead rewrites every function into a trampoline inside its own
copy of the project and expects the tests to import the code from there, which the loader
bypasses. cosmic-ray also keeps its session in SQLite (a run can resume after an interruption)
and times out each mutant separately.

The run is slow (a full test run per mutant; Lab 1 has about 250 mutants): run it under
``nice`` on one lab at a time. CI only checks the committed result's hash.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reference.loader import MUTANT_DIR_ENV
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR

RESULT_NAME = "mutation.json"
EQUIVALENT_NAME = "equivalent.json"
TOOL = "cosmic-ray"
ANNOTATION_SKIP = "in a type annotation (never evaluated: from __future__ import annotations)"
OUT_OF_SCOPE = "out of scope: runs only when a kernel launches (see CPU_SCOPE)"

#: Kernel labs: the part of ``solution.py`` that the CPU tests can reach. A generated mutant
#: elsewhere in a function changes only code that runs once the inputs are on a GPU (argument
#: packing, grid sizes, scratch buffers, the launch): the CPU suite cannot kill it and the GPU
#: suite is far too slow to run once per mutant (emulating the kernels on the CPU costs
#: seconds per kernel test, and these labs have 70-170 kernel tests). The kernels themselves
#: are covered by the hand mutants in ``mutants/*.toml``, which ``pagedlab check`` runs on a GPU.
#:
#: Each entry maps a top-level function to None (all of it, its signature's defaults included)
#: or to a *gate*: the name of the call after which everything needs a GPU (``check_on_cuda``,
#: or a validation call that ends with it). Then only the body up to and including the first
#: statement that makes that call is in scope. Module-level code (constants) is always in
#: scope; an unlisted function is out of scope; labs not listed here are in scope entirely.
CPU_SCOPE: dict[str, dict[str, str | None]] = {
    "lab04_decode_kernels": {
        "check_decode_args": None, "_check_values": None, "heads_per_cta": None,
        "plan_split_kv": None, "_prefers_v6": None,
        # check_decode_args checks the device itself (check_device=True) for naive, v1, v2;
        # v0's given launcher checks it first thing.
        "paged_attention_naive": "check_decode_args", "paged_attention_v0": "check_decode_args",
        "paged_attention_v1": "check_decode_args", "paged_attention_v2": "check_decode_args",
        "_split_kv_launch": "check_on_cuda",
        "paged_attention_v3": "_split_kv_launch", "paged_attention_v4": "_split_kv_launch",
        "paged_attention_v5": "_split_kv_launch", "paged_attention_v6": "_split_kv_launch",
        "paged_attention": "fn", "plan_decode": "_plan_decode",
    },
    "lab05_prefill_kernels": {
        "check_prefill_inputs": None, "plan_query_tiles": None, "plan_for_kernel": None,
        "_prepare": None,  # ends with the given check_launch, whose last check is check_on_cuda
        "paged_prefill_naive": "_prepare", "paged_prefill_tiled": "_prepare",
        "paged_prefill_tc": "_prepare", "paged_prefill_wgmma": "_prepare",
        "plan_prefill": "_plan_prefill",
    },
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", help="lab folder or number")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds per mutant's test run (a hang counts as killed)")
    parser.add_argument("--exclude-operator", action="append", default=[], metavar="REGEX",
                        help="cosmic-ray operators to skip (regex on core/<Name>; repeatable)")
    parser.add_argument("--session", type=Path, default=None,
                        help="keep cosmic-ray's SQLite session here (resume an interrupted run)")
    parser.add_argument("--retest-survivors", action="store_true",
                        help="with --session: run the session's survivors again (after adding "
                             "tests; killed mutants stay killed, as tests were only added)")
    parser.add_argument("--cold", action="store_true",
                        help="start a fresh interpreter per mutant instead of the warm forking "
                             "runner (reference/tools/mutate_runner.py); slower, same verdicts")


def solution_sha256(lab: str) -> str:
    """Returns the SHA-256 of ``solutions/<lab>/solution.py`` (what a result was run on).

    Args:
        lab: lab folder name.

    Returns:
        The hex digest.
    """
    return hashlib.sha256((SOLUTIONS_DIR / lab / "solution.py").read_bytes()).hexdigest()


def result_path(lab: str) -> Path:
    """Returns where a lab's committed mutation-testing result lives."""
    return SOLUTIONS_DIR / lab / RESULT_NAME


def mutant_key(operator: str, occurrence: int, line: int, source_line: str) -> str:
    """A mutant's stable name: ``<operator>#<occurrence> @<line>: <source line>``.

    The source line is part of the key so that a triage entry stops matching when the code
    under it changes.
    """
    return f"{operator}#{occurrence} @{line}: {source_line.strip()}"


def load_equivalents(lab: str) -> dict[str, str]:
    """Returns the lab's triaged equivalent mutants: key (see :func:`mutant_key`) -> reason."""
    path = SOLUTIONS_DIR / lab / "mutants" / EQUIVALENT_NAME
    if not path.exists():
        return {}
    return {e["mutant"]: e["reason"] for e in json.loads(path.read_text())["equivalent"]}


def _test_command(lab: str) -> str:
    """The lab's tests, public and hidden, stopping at the first failure (enough to kill)."""
    paths = [LABS_DIR / lab] + [p for p in [SOLUTIONS_DIR / lab / "hidden"] if p.is_dir()]
    # NOTE: -p no:nbval: the notebook plugin imports nbformat (seconds) on every run.
    args = [sys.executable, "-m", "pytest", *map(str, paths), "-x", "-q", "-p", "no:cacheprovider",
            "-p", "no:nbval", "-p", "no:randomly"]
    return " ".join(shlex.quote(a) for a in args)


def _pytest_args(lab: str) -> list[str]:
    """The arguments of :func:`_test_command` after ``python -m pytest``."""
    return shlex.split(_test_command(lab))[3:]


def _client_command(sock: Path, lab: str) -> str:
    """The warm runner's client, falling back to the plain test command."""
    args = [sys.executable, "-m", "reference.tools.mutate_runner", "client", "--socket", str(sock),
            "--", *shlex.split(_test_command(lab))]
    return " ".join(shlex.quote(a) for a in args)


def _write_config(path: Path, module: Path, test_command: str, timeout: float,
                  exclude: list[str]) -> None:
    lines = ["[cosmic-ray]", f"module-path = {json.dumps(str(module))}", f"timeout = {timeout}",
             "excluded-modules = []", f"test-command = {json.dumps(test_command)}", "",
             "[cosmic-ray.distributor]", 'name = "local"', "",
             "[cosmic-ray.filters.operators-filter]",
             f"exclude-operators = {json.dumps(exclude)}", ""]
    path.write_text("\n".join(lines))


def _cosmic_ray(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("cosmic-ray")
    cmd = [str(exe) if exe.exists() else "cosmic-ray", *args]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True)


def _forget_survivors(db: Path) -> int:
    """Drops the recorded result of every surviving mutant, so that ``exec`` runs it again.

    Adding tests can only turn a survivor into a kill, never a kill into a survivor, so a
    session resumed this way ends exactly where a fresh run with the new tests would.

    Args:
        db: a cosmic-ray session.

    Returns:
        How many survivors will be run again.
    """
    from cosmic_ray.work_db import WorkDB, WorkResultStorage, use_db
    from cosmic_ray.work_item import TestOutcome

    with use_db(str(db), WorkDB.Mode.open) as work_db:
        with work_db._session_maker.begin() as sql:  # NOTE: cosmic-ray has no public call for it
            return sql.query(WorkResultStorage).filter(
                WorkResultStorage.test_outcome == TestOutcome.SURVIVED).delete()


def _check_session_solution(db: Path, lab: str) -> None:
    """Refuses to resume a session made for another version of the solution.

    A session stores each mutant as a position in the file it was made from: on a changed
    solution those positions point at the wrong code.
    """
    stamp = db.with_name(db.name + ".sha256")
    if not db.exists():
        stamp.write_text(solution_sha256(lab) + "\n")
    elif stamp.exists() and stamp.read_text().strip() != solution_sha256(lab):
        raise RuntimeError(f"{db} was made for another version of solutions/{lab}/solution.py: "
                           f"delete it (and {stamp.name}) to start over")


def run_mutation(lab: str, timeout: float, exclude: list[str], session: Path | None,
                 retest_survivors: bool = False, cold: bool = False) -> dict:
    """Runs cosmic-ray over a scratch copy of the lab's solution and returns the result record.

    Args:
        lab: lab folder name.
        timeout: seconds per mutant.
        exclude: operator regexes to skip.
        session: SQLite session to create or resume; None uses a temporary one.
        retest_survivors: run the session's survivors again (see :func:`_forget_survivors`).
        cold: a fresh interpreter per mutant instead of the warm runner.

    Returns:
        The record written to ``mutation.json`` (see the module docstring).
    """
    with tempfile.TemporaryDirectory(prefix=f"mutate-{lab}-") as tmp:
        # A kept session remembers the mutated file's path: keep the scratch copy beside it.
        work = session.with_name(session.name + ".d") if session else Path(tmp)
        scratch = work / lab
        # Always a fresh copy: an interrupted run may have left a mutant on disk.
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(SOLUTIONS_DIR / lab, scratch,
                        ignore=shutil.ignore_patterns("__pycache__", "mutants", "hidden", "*.json"))
        sock = Path(tmp) / "runner.sock"
        config = work / "cosmic-ray.toml"
        test_command = _test_command(lab) if cold else _client_command(sock, lab)
        _write_config(config, scratch / "solution.py", test_command, timeout, exclude)
        db = session or Path(tmp) / "session.sqlite"
        if session:
            _check_session_solution(db, lab)
        # NOTE: no bytecode cache: a mutant of the same size written within the same second as
        # the previous one would otherwise be served from a stale .pyc (mtime + size match).
        env = dict(os.environ, **{MUTANT_DIR_ENV: str(scratch)}, PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        started = dt.datetime.now(dt.timezone.utc)
        if not db.exists():
            _cosmic_ray("init", str(config), str(db), env=env)
        filt = Path(sys.executable).with_name("cr-filter-operators")
        subprocess.run([str(filt), str(db), str(config)], env=env, check=True, capture_output=True)
        _skip_annotations(db, scratch / "solution.py")
        _skip_out_of_scope(db, scratch / "solution.py", CPU_SCOPE.get(lab))
        if retest_survivors:
            print(f"running {_forget_survivors(db)} survivors again", file=sys.stderr)
        server = None if cold else _start_runner(sock, lab, timeout, env)
        try:
            # Twice with the warm runner: in the usual order (recording durations), then in
            # the fastest-first order the mutants will run in; both must pass.
            for _ in range(1 if cold else 2):
                baseline = subprocess.run(test_command, shell=True, env=env, cwd=REPO_ROOT,
                                          capture_output=True, text=True)
                if baseline.returncode != 0:
                    plain = subprocess.run(_test_command(lab), shell=True, env=env, cwd=REPO_ROOT,
                                           capture_output=True, text=True)
                    raise RuntimeError(f"the unmutated solution fails its tests:\n"
                                       f"{plain.stdout[-2000:]}")
            _cosmic_ray("exec", str(config), str(db), env=env)
        finally:
            if server is not None:
                server.terminate()
                server.wait()
        dump = _cosmic_ray("dump", str(db), env=env).stdout
        source = (SOLUTIONS_DIR / lab / "solution.py").read_text().splitlines()
        finished = dt.datetime.now(dt.timezone.utc)
    return _record(lab, dump, source, timeout, exclude, started, finished, cold)


def _start_runner(sock: Path, lab: str, timeout: float, env: dict[str, str]) -> subprocess.Popen:
    """Starts the warm runner (``reference/tools/mutate_runner.py``) and waits for its socket."""
    import time

    server = subprocess.Popen(
        [sys.executable, "-m", "reference.tools.mutate_runner", "serve", "--socket", str(sock),
         "--lab", lab, "--timeout", str(timeout), "--", *_pytest_args(lab)],
        env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + 120
    while not sock.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError("the warm test runner did not start (try --cold)")
        time.sleep(0.2)
    return server


def scope_spans(module: Path, scope: dict[str, str | None]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, as (line, col), of the code outside a lab's CPU scope.

    Args:
        module: the solution file.
        scope: see :data:`CPU_SCOPE`.

    Returns:
        Spans of unlisted top-level functions, and of each gated function's signature and of
        its body after the first statement that calls the gate.
    """
    def calls(node: ast.AST, name: str) -> bool:
        return any(isinstance(n, ast.Call) and name in (getattr(n.func, "id", None),
                                                         getattr(n.func, "attr", None))
                   for n in ast.walk(node))

    spans = []
    for node in ast.parse(module.read_text()).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        end = (node.end_lineno, node.end_col_offset)
        if node.name not in scope:
            spans.append(((node.lineno, 0), end))
            continue
        gate = scope[node.name]
        if gate is None:
            continue
        first = node.body[0]
        spans.append(((node.lineno, 0), (first.lineno, first.col_offset)))
        gated = [i for i, stmt in enumerate(node.body) if calls(stmt, gate)]
        if not gated:
            raise ValueError(f"CPU_SCOPE: {node.name} never calls its gate {gate!r}")
        rest = node.body[gated[0] + 1:]
        if rest:
            spans.append(((rest[0].lineno, rest[0].col_offset), end))
    return spans


def _skip_out_of_scope(db: Path, module: Path, scope: dict[str, str | None] | None) -> None:
    """Marks mutants outside the lab's CPU scope (see :data:`CPU_SCOPE`) as skipped."""
    if scope is None:
        return
    _skip_spans(db, scope_spans(module, scope), OUT_OF_SCOPE)


def _skip_spans(db: Path, spans, reason: str) -> None:
    """Marks every pending mutant that starts inside one of ``spans`` as skipped for ``reason``."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(db), WorkDB.Mode.open) as work_db:
        for item in list(work_db.pending_work_items):
            start = tuple(item.mutations[0].start_pos)
            if any(lo <= start < hi for lo, hi in spans):
                work_db.set_result(item.job_id, WorkResult(
                    output=reason, worker_outcome=WorkerOutcome.SKIPPED))


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, as (line, col), of every annotation in a module."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                           a.kwarg] if x is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in anns if n]
    return spans


def _skip_annotations(db: Path, module: Path) -> None:
    """Marks mutants inside type annotations as skipped before they cost a test run.

    NOTE: the solutions use ``from __future__ import annotations``, so annotations are never
    evaluated: ``int | None`` mutated to ``int - None`` is equivalent by construction.
    """
    _skip_spans(db, _annotation_spans(module), ANNOTATION_SKIP)


def _record(lab: str, dump: str, source: list[str], timeout: float, exclude: list[str],
            started: dt.datetime, finished: dt.datetime, cold: bool = False) -> dict:
    equivalents = load_equivalents(lab)
    mutants, counts = [], {"killed": 0, "survived": 0, "equivalent": 0, "skipped": 0,
                           "incompetent": 0, "annotation": 0, "out_of_scope": 0}
    for line in dump.splitlines():
        item, result = json.loads(line)
        (m,) = item["mutations"]
        row = m["start_pos"][0]
        key = mutant_key(m["operator_name"], m["occurrence"], row, source[row - 1])
        entry = {"mutant": key}
        if result is not None and result.get("output") == ANNOTATION_SKIP:
            outcome = "annotation"
        elif result is not None and result.get("output") == OUT_OF_SCOPE:
            outcome = "out_of_scope"
        elif result is None or result["worker_outcome"] == "skipped":
            outcome = "skipped"
        elif result["test_outcome"] == "survived":
            outcome = "equivalent" if key in equivalents else "survived"
            entry["reason"] = equivalents.get(key, "NOT TRIAGED: no test fails")
            entry["diff"] = [d for d in (result.get("diff") or "").splitlines()
                             if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        elif result["test_outcome"] == "incompetent":
            outcome = "incompetent"  # the mutant does not even import/run: not a test's merit
        else:
            outcome = "killed"
        entry["outcome"] = outcome
        counts[outcome] += 1
        mutants.append(entry)
    non_equivalent = counts["killed"] + counts["survived"]
    return {
        "lab": lab,
        "date": finished.date().isoformat(),
        "tool": TOOL,
        "tool_version": importlib.metadata.version("cosmic-ray"),
        "solution": f"solutions/{lab}/solution.py",
        "solution_sha256": solution_sha256(lab),
        "tests": _test_command(lab).replace(str(REPO_ROOT) + "/", "").replace(sys.executable, "python"),
        "timeout_s": timeout,
        "runner": ("a fresh interpreter per mutant" if cold else
                   "warm: pytest.main in a fork of a pre-imported process, fastest tests first "
                   "(reference/tools/mutate_runner.py)"),
        "excluded_operators": exclude,
        "scope": CPU_SCOPE.get(lab, "the whole solution"),
        "last_invocation_wall_s": round((finished - started).total_seconds()),  # resumed runs: less
        "counts": counts,
        "kill_rate": round(counts["killed"] / non_equivalent, 4) if non_equivalent else 1.0,
        "mutants": sorted(mutants, key=lambda e: (e["outcome"] == "killed", e["mutant"])),
    }


def main(args: argparse.Namespace) -> int:
    from reference.paths import resolve_labs

    if not SOLUTIONS_DIR.is_dir():
        print("pagedlab mutate: needs solutions/ (not available in a student release)", file=sys.stderr)
        return 2
    (lab,) = resolve_labs([args.lab])
    if shutil.which("cosmic-ray") is None and not Path(sys.executable).with_name("cosmic-ray").exists():
        print("pagedlab mutate: needs cosmic-ray (pip install -e '.[mutation]')", file=sys.stderr)
        return 2
    if args.retest_survivors and args.session is None:
        print("pagedlab mutate: --retest-survivors needs --session", file=sys.stderr)
        return 2
    record = run_mutation(lab, args.timeout, args.exclude_operator, args.session,
                          args.retest_survivors, args.cold)
    result_path(lab).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    c = record["counts"]
    print(f"{lab}: {c['killed']} killed, {c['survived']} survived, {c['equivalent']} equivalent, "
          f"{c['incompetent']} incompetent, {c['skipped']} skipped, "
          f"{c['out_of_scope']} out of scope — kill rate "
          f"{record['kill_rate']:.1%} of non-equivalent mutants; wrote {result_path(lab)}")
    for e in record["mutants"]:
        if e["outcome"] == "survived":
            print(f"  SURVIVED {e['mutant']}\n      {' | '.join(e['diff'])}")
    return 1 if c["survived"] else 0
