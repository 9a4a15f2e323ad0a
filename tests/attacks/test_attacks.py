"""Infrastructure (no points): every attack in payloads.py scores 0 on all three grading paths.

One synthetic workbook holds one lab per payload; it is released (``pagedlab release``) and
bundled (``pagedlab gradescope-bundle``) like the real one, the payloads are laid over a copy
of the student release as a student would commit them, and that copy is graded

* locally, ``pagedlab grade --isolated`` (the grading mode of the CLI);
* as the Classroom workflow does: ``pagedlab grade --classroom --manifest-digest D``
  (isolated by default), read back through the reporter's arithmetic;
* by the Gradescope bundle's ``run_autograder`` in a fake ``/autograder``.

NOTE: isolation runs student code as another user, so these tests need root (CI is root)
and a workbook every user can read: it lives in a world-readable temporary folder.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grading_helpers import make_workbook, pagedlab  # noqa: E402
from payloads import PAYLOADS, TODO  # noqa: E402
from reference.grader.sandbox import IsolationError, ensure_worker_user  # noqa: E402

try:
    ensure_worker_user()
    CANNOT = None
except IsolationError as exc:
    CANNOT = str(exc)
pytestmark = [pytest.mark.skipif(CANNOT is not None, reason=f"isolation unavailable: {CANNOT}"),
              pytest.mark.slow]  # minutes: every attack through three grading paths

TESTS = '''
import pytest

from labs.{lab}._check import check


@pytest.mark.points(1)
def test_small(impl):
    """Small rectangles."""
    assert check(impl.area(2, 3), 6)


@pytest.mark.points(1)
def test_large(impl):
    """Larger ones."""
    got = impl.area(4, 5)
    assert got == 20


@pytest.mark.points(1)
def test_in_a_child_process(impl):
    """Computed in a child process of the test's, as Lab 1's hash test does."""
    import sys

    from reference.child import run_with_implementation

    code = "from reference.loader import load_impl; print(load_impl('{lab}').area(3, 3))"
    proc = run_with_implementation([sys.executable, "-s", "-c", code], timeout=30)
    assert proc.stdout.split()[-1:] == ["9"], proc.stderr[-500:]
'''
CHECK = '''
def check(got, want):
    """True when got equals want (a trusted helper the tests import)."""
    return got == want
'''
HIDDEN = '''
import pytest

SECRET = "HIDDEN-SECRET-{lab}"


@pytest.mark.points(1)
def test_hidden(impl):
    """Hidden."""
    assert impl.area(7, 3) == 21, "area of a 7 x 3 rectangle"
'''
SOLUTION = '''
def area(w, h):
    """Returns w * h."""
    return w * h
'''
# An "unchecked-hash" .pyc of a helper that says yes to everything (a committed __pycache__).
PYC_SOURCE = "def check(got, want):\n    return True\n"
TIMEOUT = "4"


def _lab(name: str) -> str:
    return f"lab{60 + sorted(PAYLOADS).index(name)}_{name}"


LABS = {name: _lab(name) for name in PAYLOADS} | {"pyc": "lab59_pyc"}


def _readable_tmp() -> Path:
    path = Path(tempfile.mkdtemp(prefix="pagedlab-attacks-"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def world():
    """(workbook, student release, bundle zip, digest, scratch root) built once."""
    top = _readable_tmp()
    labs = {lab: {"starter.py": TODO, f"test_{lab.split('_')[0]}_x.py": TESTS.format(lab=lab),
                  "_check.py": CHECK} for lab in LABS.values()}
    sols = {lab: {"solution.py": SOLUTION,
                  f"hidden/test_{lab.split('_')[0]}_hidden_x.py": HIDDEN.format(lab=lab)}
            for lab in LABS.values()}
    wb = make_workbook(top / "wb", labs, solutions=sols)
    release = top / "release"
    proc = pagedlab(wb, "release", str(release), "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bundle = top / "bundle.zip"
    proc = pagedlab(wb, "gradescope-bundle", str(bundle), "--timeout", TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pinned = json.loads(zipfile.ZipFile(bundle).read("pagedlab-autograder.json"))
    workflow = (release / ".github/workflows/classroom.yml").read_text()
    digest = workflow.split("--manifest-digest ")[1].split()[0]
    yield {"top": top, "release": release, "bundle": bundle, "digest": digest,
           "bundle_digest": pinned["manifest_digest"]}
    shutil.rmtree(top, ignore_errors=True)


def _submission(world, dest: Path, fill: dict[str, str]) -> Path:
    """The student release with every payload committed into its lab."""
    shutil.copytree(world["release"], dest, symlinks=True)
    for name, files in PAYLOADS.items():
        folder = dest / "labs" / LABS[name]
        for fname, text in files.items():
            for key, value in fill.items():
                text = text.replace("{" + key + "}", value)
            (folder / fname).write_text(text)
    pyc_dir = dest / "labs" / LABS["pyc"] / "__pycache__"
    pyc_dir.mkdir()
    src = dest / "tmp_check.py"
    src.write_text(PYC_SOURCE)
    import py_compile

    py_compile.compile(str(src), cfile=str(pyc_dir / f"_check.{sys.implementation.cache_tag}.pyc"),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    src.unlink()
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def _guarded_file(top: Path, name: str) -> Path:
    path = top / name
    path.write_text("ORIGINAL\n")
    path.chmod(0o644)
    return path


def _per_lab(tests: list[dict], key=lambda t: t["tags"] if "tags" in t else []) -> dict:
    scores: dict[str, float] = {}
    for test in tests:
        lab = next((lab for lab in LABS.values() if lab in json.dumps(test)), None)
        scores[lab] = scores.get(lab, 0) + test.get("score", 0)
    return scores


def _assert_all_zero(scores: dict, where: str, text: str) -> None:
    leaked = {lab: s for lab, s in scores.items() if s}
    assert not leaked, f"{where}: attacks earned points: {leaked}\n{text[-3000:]}"
    for name, lab in LABS.items():
        assert "HIDDEN-SECRET" not in text, f"{where}: hidden test source leaked"


def test_every_attack_scores_zero_locally(world, tmp_path):
    """`pagedlab grade --isolated` on the student's tree: every payload lab scores 0, the
    trusted conftest.py is untouched and the grade completes."""
    top = _readable_tmp()
    env_file = _guarded_file(top, "github_env")
    pidfile = _guarded_file(top, "daemon_pids")
    pidfile.write_text("")
    pidfile.chmod(0o666)
    root = _submission(world, top / "s", {"RESULTS": str(top / "results.json"),
                                          "BUNDLE": str(top / "none"), "GITHUB_ENV": str(env_file),
                                          "PIDFILE": str(pidfile)})
    conftest = (root / "conftest.py").read_text()
    results = top / "out.json"
    proc = pagedlab(root, "grade", "--isolated", "--timeout", TIMEOUT, "--results", str(results),
                    "--summary", str(top / "s.md"), "--quiet", timeout=900)
    assert results.exists(), proc.stdout + proc.stderr
    res = json.loads(results.read_text())
    _assert_all_zero(_per_lab(res["tests"]), "local", json.dumps(res) + proc.stdout)
    assert res["max_score"] == 3 * len(LABS)
    assert (root / "conftest.py").read_text() == conftest
    assert env_file.read_text() == "ORIGINAL\n"
    assert "startup_files" in res["output"] or "sitecustomize" in res["output"]
    lines = pidfile.read_text().splitlines()
    homes = [line.split(" ", 1)[1] for line in lines if line.startswith("home ")]
    assert homes and not [h for h in homes if os.path.exists(h)], \
        f"worker homes outlived the grading (the next submission could read them): {homes}"
    for what in (["beat", "daemon"], ["beat", "daemon_thread"], ["beat", "pid1_exec"], ["chain"]):
        assert any(line.split()[:len(what)] == what for line in lines), \
            f"{' '.join(what)!r}: the payload never ran"
    time.sleep(1.0)  # NOTE: live payloads append every 0.2 s (the daemons), 10 ms (the chain)
    grown = pidfile.read_text().splitlines()[len(lines):]
    beating = sorted({"chain" if line.startswith("chain") else line for line in grown})
    assert not grown, f"outlived the grading, still beating: {beating} ({len(grown)} beats in 1 s)"


def test_every_attack_scores_zero_on_the_classroom_path(world):
    """The Classroom step (`grade --classroom --manifest-digest`, isolated by default): the
    reporter's total is 0 and $GITHUB_ENV is untouched."""
    top = _readable_tmp()
    env_file = _guarded_file(top, "github_env")
    out_file = top / "github_output"
    root = _submission(world, top / "s", {"RESULTS": str(top / "results.json"),
                                          "BUNDLE": str(top / "none"), "GITHUB_ENV": str(env_file),
                                          "PIDFILE": str(top / "pids")})
    env = {"GITHUB_ENV": str(env_file), "GITHUB_OUTPUT": str(out_file)}
    proc = pagedlab(root, "grade", "--classroom", "--manifest-digest", world["digest"],
                    "--timeout", TIMEOUT, "--results", str(top / "r.json"), "--summary",
                    str(top / "s.md"), "--quiet", env=env, timeout=900)
    line = out_file.read_text().strip().splitlines()[-1]
    result = json.loads(base64.b64decode(line.split("=", 1)[1]))
    _assert_all_zero({"all": sum(t["score"] for t in result["tests"])}, "classroom",
                     json.dumps(result) + proc.stdout + proc.stderr)
    assert env_file.read_text() == "ORIGINAL\n"
    proc = pagedlab(root, "grade", "--classroom", "--timeout", TIMEOUT, env=env)
    assert proc.returncode == 2 and "--manifest-digest" in proc.stderr


def test_every_attack_scores_zero_on_gradescope(world):
    """The bundle's run_autograder on the same submission: every test 0, no hidden source
    in results.json, the shared bundle folder unchanged for the next submission."""
    top = _readable_tmp()
    auto = top / "autograder"
    (auto / "source").mkdir(parents=True)
    with zipfile.ZipFile(world["bundle"]) as zf:
        zf.extractall(auto / "source")
    for path in [auto, *auto.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    env_file = _guarded_file(top, "github_env")
    _submission(world, auto / "submission", {"RESULTS": str(auto / "results" / "results.json"),
                                             "BUNDLE": str(auto / "source"),
                                             "GITHUB_ENV": str(env_file),
                                             "PIDFILE": str(top / "pids")})
    before = (auto / "source" / "conftest.py").read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "PYTEST_ADDOPTS")}
    env.update(PAGEDLAB_AUTOGRADER_ROOT=str(auto), PAGEDLAB_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(auto / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=900)
    res = json.loads((auto / "results" / "results.json").read_text())
    text = json.dumps(res)
    _assert_all_zero(_per_lab(res["tests"]), "gradescope", text + proc.stdout + proc.stderr)
    assert res["score"] == 0, text[-2000:]
    assert len(res["tests"]) == 4 * len(LABS), text[-2000:]  # hidden ones counted
    assert (auto / "source" / "conftest.py").read_text() == before
    assert env_file.read_text() == "ORIGINAL\n"
