"""``pagedlab gradescope-bundle OUT.zip``: the Gradescope autograder, built from this workbook.

The zip holds, at its root (Gradescope unpacks it into ``/autograder/source``):

* the student release of the chosen labs (:mod:`reference.grader.release`) — the *trusted* copy of the
  tests, ``conftest.py``, ``pyproject.toml`` and ``reference/`` that grading uses;
* the hidden tests, as ``hidden/<lab>/`` (never ``solutions/``: a bundle holds no solution a
  submission could import);
* ``.pagedlab-manifest.json`` listing every test to expect, hidden ones included;
* ``pagedlab-autograder.json`` (labs, per-test timeout, tamper policy);
* ``setup.sh`` (run once when Gradescope builds the image: a virtual environment with the CPU
  build of torch and the workbook's test dependencies) and ``run_autograder`` (run per
  submission: copies the bundle to a scratch folder, lays the student's own files over it —
  :mod:`reference.grader.autograder` — grades, and writes ``/autograder/results/results.json``).

``PAGEDLAB_AUTOGRADER_ROOT`` (default ``/autograder``) and ``PAGEDLAB_PYTHON`` let both scripts
run outside Gradescope, which is how the tests exercise them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path

from reference.grader.hidden import hidden_test_files
from reference.grader.autograder import CONFIG_NAME
from reference.grader.manifest import digest
from reference.grader.results import total_points
from reference.paths import SOLUTIONS_DIR, lab_names
from reference.grader.runner import DEFAULT_TEST_TIMEOUT_S

TEMPLATES = Path(__file__).resolve().parent / "templates"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("zip", help="the autograder zip to write, e.g. lab1-autograder.zip")
    parser.add_argument("labs", nargs="*", help="labs this assignment grades (default: all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TEST_TIMEOUT_S,
                        help="per-test time limit in seconds (default %(default)g)")
    parser.add_argument("--on-tamper", choices=("flag", "zero", "refuse"), default="zero",
                        help="when a submission edited protected files (they are never used: "
                             "grading runs the bundle's copies): score 0 (default), flag, or "
                             "refuse")


def build_bundle(zip_path: Path, labs: list[str], *, timeout_s: float = DEFAULT_TEST_TIMEOUT_S,
                 on_tamper: str = "zero", hidden_messages: bool = False,
                 log=print) -> tuple[dict, list[str]]:
    """Writes the autograder zip.

    Args:
        zip_path: destination ``.zip``.
        labs: lab folder names to grade.
        timeout_s: per-test time limit.
        on_tamper: policy for submissions whose protected files differ.
        hidden_messages: show failed hidden tests' messages (after the due date); by default
            students see only how many hidden tests failed.
        log: where progress lines go.

    Returns:
        (the bundle's manifest, problems found while building).
    """
    from reference.grader.release import build_release, torch_pin

    extra = {f"hidden/{lab}/{f.name}": f for lab in labs for f in hidden_test_files(lab)}
    with tempfile.TemporaryDirectory(prefix="pagedlab-bundle-") as tmp:
        root = Path(tmp) / "source"
        manifest, problems = build_release(root, labs, extra=extra, log=log)
        config = {"labs": labs, "timeout_s": timeout_s, "on_tamper": on_tamper,
                  "hidden_messages": hidden_messages, "manifest_digest": digest(manifest)}
        (root / CONFIG_NAME).write_text(json.dumps(config, indent=1) + "\n")
        setup = (TEMPLATES / "setup.sh").read_text().replace("@TORCH@", torch_pin())
        zip_path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    zf.write(path, path.relative_to(root).as_posix())
            _add_script(zf, "setup.sh", setup)
            _add_script(zf, "run_autograder", (TEMPLATES / "run_autograder").read_text())
    num_hidden = len(extra)
    log(f"  {num_hidden} hidden test file(s); wrote {zip_path}")
    return manifest, problems


def _add_script(zf: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16  # executable once unpacked
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, text)


def main(args: argparse.Namespace) -> int:
    from reference.paths import resolve_labs

    if not SOLUTIONS_DIR.is_dir():
        print("pagedlab gradescope-bundle: needs solutions/ (run it from the instructors' "
              "workbook)", file=sys.stderr)
        return 2
    labs = resolve_labs(args.labs) if args.labs else lab_names()
    zip_path = Path(args.zip).resolve()
    print(f"pagedlab gradescope-bundle: {', '.join(labs)} -> {zip_path}")
    manifest, problems = build_bundle(zip_path, labs, timeout_s=args.timeout,
                                      on_tamper=args.on_tamper)
    total = total_points(p for tests in manifest["tests"].values() for p in tests.values())
    print(f"  {sum(len(t) for t in manifest['tests'].values())} tests, {float(total):g} points "
          f"(hidden included)")
    if problems:
        print(f"\npagedlab gradescope-bundle: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
        return 1
    return 0
