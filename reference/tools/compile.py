"""``pagedlab compile``: compile-check every ``.cu`` file for sm_80 and sm_90, no GPU needed.

Each file is also compiled for sm_75 (Colab's and Kaggle's T4). A file that uses what only
sm_80 has (``mma.sync`` m16n8k16, ``cp.async``, bf16 arithmetic) is reported as not runnable
there, with the :class:`~reference.errors.UnsupportedConfigError` message, not as a failure;
any other sm_75 error fails as usual. (NVRTC stops at PTX, so only nvcc, which runs ptxas, can
tell; with NVRTC sm_75 is compiled like any target.)

Uses ``nvcc`` when it is on PATH (or under ``$CUDA_HOME``), else NVRTC through CuPy. Errors are
printed with file and line numbers, as the compiler reports them. Include folders are the
loader's (:func:`reference.cuda.kernel_include_dirs`): a solution finds the headers its lab hands
out in ``labs/<lab>/``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reference.cuda import BASE_OPTIONS, cuda_home, include_options, kernel_include_dirs
from reference.paths import LABS_DIR, SOLUTIONS_DIR

DEFAULT_ARCHS = ("sm_80", "sm_90")
#: Turing (T4): the CUDA-core stages run there, the tensor-core and cp.async ones need sm_80.
T4_ARCH = "sm_75"
_NEEDS_SM80_RE = re.compile(r"Feature '([^']+)' requires \.target sm_80")
_FEATURE_NAMES = {".m16n8k16": "mma.sync m16n8k16", "cp.async": "cp.async"}
_ERROR_RE = re.compile(r"\berror\b", re.I)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", help=".cu files or folders (default: labs/ and solutions/)")
    parser.add_argument("--arch", nargs="+", default=[*DEFAULT_ARCHS, T4_ARCH],
                        help="targets, e.g. sm_90 (default: sm_80 sm_90 sm_75)")
    parser.add_argument("--resources", action="store_true",
                        help="print registers / shared memory / spills per kernel (nvcc only)")


def find_cu_files(paths: list[str] | None = None) -> list[Path]:
    """Returns the ``.cu`` files under the given paths (default: labs/ and solutions/)."""
    roots = [Path(p) for p in paths] if paths else [LABS_DIR, SOLUTIONS_DIR]
    files: list[Path] = []
    for root in roots:
        files += [root] if root.is_file() else sorted(root.rglob("*.cu"))
    return files


def nvcc_path() -> str | None:
    """Returns the nvcc executable, or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = cuda_home()
    if home and (home / "bin" / "nvcc").exists():
        return str(home / "bin" / "nvcc")
    return None


def compiler_available() -> str | None:
    """Returns "nvcc", "nvrtc" or None: what :func:`compile_cu` would use."""
    if nvcc_path():
        return "nvcc"
    try:
        import cupy.cuda.compiler  # noqa: F401

        return "nvrtc"
    except Exception:  # noqa: BLE001 — CuPy missing or its CUDA libraries missing
        return None


def compile_cu(path: Path, archs, *, resources: bool = False) -> tuple[bool, str]:
    """Compiles one file for one or more targets (through ptxas when nvcc is used).

    Args:
        path: the ``.cu`` file.
        archs: an ``sm_XX`` target or a sequence of them; nvcc builds them in one call.
        resources: ask ptxas for the per-kernel resource report.

    Returns:
        (ok, compiler output).

    NOTE: the targets built are :func:`build_targets`' (sm_90a for the Hopper files).
    """
    archs = build_targets(path, archs)
    nvcc = nvcc_path()
    if nvcc:
        gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
        with tempfile.TemporaryDirectory() as tmp:
            # --threads 0: one thread per target (CI machines have 2 cores).
            cmd = [nvcc, *BASE_OPTIONS, *gencode, "--threads", "0", "-fatbin", "-o", str(Path(tmp) / "k.fatbin"),
                   *(f"-I{d}" for d in kernel_include_dirs(path)), *include_options(), str(path)]
            if resources:
                cmd.insert(1, "-Xptxas=-v")
            proc = subprocess.run(cmd, capture_output=True, text=True)
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()
    from cupy.cuda import compiler

    for arch in archs:
        try:
            includes = tuple(f"-I{d}" for d in kernel_include_dirs(path))
            compiler.compile_using_nvrtc(path.read_text(), options=BASE_OPTIONS + includes
                                         + include_options(), arch=arch.replace("sm_", ""),
                                         filename=str(path))  # "90a": CuPy passes it on as is
        except compiler.CompileException as exc:
            return False, f"[{arch}] {exc}"
    return True, ""


def build_targets(path: Path, archs) -> list[str]:
    """The targets a file is built for: ``archs``, except that a file that uses Hopper's wgmma
    or includes its wrappers' header (``reference.cuda.sm90a_features``) is built for sm_90a
    only — no other target has those instructions.

    Args:
        path: the ``.cu`` file.
        archs: an ``sm_XX`` target or a sequence of them.
    """
    from reference.cuda import sm90a_features

    if sm90a_features(path):
        return ["sm_90a"]
    return [archs] if isinstance(archs, str) else list(archs)


def sm80_features(log: str) -> list[str] | None:
    """Returns the sm_80-only features a failed pre-sm_80 build names, when those are its only
    errors (the file is fine, the target is too old); None when anything else failed.

    Args:
        log: nvcc's output for a pre-sm_80 target.
    """
    errors = [line for line in log.splitlines() if _ERROR_RE.search(line)]
    features = [_FEATURE_NAMES.get(m.group(1), m.group(1)) for line in errors
                for m in [_NEEDS_SM80_RE.search(line)] if m]
    if not errors or len(features) != len(errors):
        return None
    return sorted(set(features))


def unsupported_on(arch: str, path: Path, features: list[str]) -> str:
    """The :class:`~reference.errors.UnsupportedConfigError` message for a file an old GPU cannot
    run (what a launcher says on such a device, and what ``pagedlab compile`` prints)."""
    from reference.errors import UnsupportedConfigError

    return "UnsupportedConfigError: " + str(UnsupportedConfigError(
        f"{path.name} needs compute capability 8.0 (sm_80) or newer: it uses "
        f"{', '.join(features)}, which {arch} lacks (a T4 is sm_75). Run this stage on an "
        f"sm_80+ GPU, or emulated on the CPU (PAGEDLAB_DEVICE=emulate)"))


def main(args: argparse.Namespace) -> int:
    tool = compiler_available()
    if tool is None:
        print("pagedlab compile: neither nvcc nor NVRTC (CuPy) is available; install the CUDA "
              "toolkit or pip install -e '.[gpu]'", file=sys.stderr)
        return 2
    files = find_cu_files(args.paths)
    old = [a for a in args.arch if a.startswith("sm_") and a[3:].isdigit() and int(a[3:]) < 80]
    new = [a for a in args.arch if a not in old]
    failures = unsupported = 0
    for path in files:
        for archs in ([new] if new else []) + [[a] for a in old]:
            ok, log = compile_cu(path, archs, resources=args.resources)
            features = sm80_features(log) if not ok and archs[0] in old and tool == "nvcc" else None
            if features:
                unsupported += 1
                print(f"n/a  {archs[0]} {path} ({tool}): {unsupported_on(archs[0], path, features)}")
                continue
            failures += not ok
            built = " ".join(build_targets(path, archs))
            print(f"{'ok  ' if ok else 'FAIL'} {built} {path} ({tool})")
            if log and (not ok or args.resources):
                print("    " + log.replace("\n", "\n    "))
    print(f"\n{len(files)} files × {len(args.arch)} targets: {failures} failed"
          + (f", {unsupported} need sm_80 (not runnable on {', '.join(old)})" if unsupported else ""))
    return 1 if failures else 0
