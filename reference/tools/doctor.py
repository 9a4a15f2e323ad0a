"""``pagedlab doctor``: what this machine has, and which labs can run here.

Checks Python, the packages the tests need, the GPU stack (torch's CUDA, CuPy, the driver,
NVRTC, nvcc) and the GPU itself, then says per lab whether it runs fully, runs its CPU part
only (GPU tests skip), or cannot run — with the command that fixes each miss.

Exit codes: 0 every lab can at least run its CPU part; 1 something a lab needs is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
from dataclasses import dataclass

from reference.tools.labinfo import lab_needs
from reference.paths import lab_names

INSTALL = "pip install torch==2.13.0 -e '.[dev]'"
INSTALL_GPU = ("pip install -e '.[gpu]' (NVIDIA driver >= 580, CUDA 13) or "
               "pip install -e '.[gpu-cu12]' (CUDA 12 drivers)")


@dataclass
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # needed by every lab (else only by the GPU parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package(name: str, dist: str, fix: str = INSTALL, required: bool = True) -> Check:
    version = _version(dist)
    return Check(name, version is not None, version or "not installed", "" if version else fix,
                 required)


def check_python() -> Check:
    """Python >= 3.10."""
    ok = sys.version_info >= (3, 10)
    return Check("Python", ok, sys.version.split()[0] + f" ({sys.executable})",
                 "" if ok else "install Python 3.10 or newer")


def check_torch() -> list[Check]:
    """torch and what it sees of CUDA."""
    try:
        import torch
    except ImportError:
        return [Check("torch", False, "not installed", INSTALL)]
    checks = [Check("torch", True, f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")]
    if torch.cuda.is_available():
        checks.append(Check("GPU", True, f"{torch.cuda.get_device_name(0)} × "
                                         f"{torch.cuda.device_count()}", required=False))
    else:
        fix = ("a CPU build of torch is installed: pip install torch --index-url "
               "https://download.pytorch.org/whl/cu130" if not torch.version.cuda
               else "no GPU visible: check nvidia-smi and CUDA_VISIBLE_DEVICES")
        checks.append(Check("GPU", False, "torch sees no CUDA GPU", fix, required=False))
    return checks


def check_driver() -> Check:
    """The NVIDIA driver, through nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Check("NVIDIA driver", False, "nvidia-smi not found",
                     "install the NVIDIA driver (a machine with an NVIDIA GPU)", required=False)
    proc = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True)
    ok = proc.returncode == 0 and proc.stdout.strip() != ""
    detail = proc.stdout.strip().splitlines()[0] if ok else (proc.stderr.strip() or "no GPU")
    return Check("NVIDIA driver", ok, detail, "" if ok else "check the driver: nvidia-smi",
                 required=False)


def check_cupy() -> list[Check]:
    """CuPy, the CUDA runtime it was built for, and NVRTC."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 — ImportError or a missing CUDA library
        detail = "not installed" if isinstance(exc, ImportError) else f"broken: {exc}"
        return [Check("CuPy", False, detail, INSTALL_GPU, required=False),
                Check("NVRTC", False, "needs CuPy", INSTALL_GPU, required=False)]
    checks = [Check("CuPy", True, cupy.__version__, required=False)]
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        checks.append(Check("NVRTC", True, f"{major}.{minor}", required=False))
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("NVRTC", False, f"unusable: {exc}", INSTALL_GPU, required=False))
    return checks


def check_nvcc() -> Check:
    """nvcc (optional: NVRTC compiles the kernels; nvcc adds resource reports)."""
    from reference.tools.compile import nvcc_path

    nvcc = nvcc_path()
    if not nvcc:
        return Check("nvcc", False, "not found (optional: NVRTC compiles kernels at run time)",
                     "install the CUDA toolkit for `pagedlab compile --resources`", required=False)
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return Check("nvcc", True, (out.strip().splitlines() or [nvcc])[-1], required=False)


def run_checks() -> list[Check]:
    """Returns every check, in report order."""
    checks = [check_python(), _package("numpy", "numpy")]
    checks += check_torch()
    checks += [_package("pytest", "pytest"), _package("hypothesis", "hypothesis"),
               _package("pytest-timeout", "pytest-timeout",
                        required=False, fix=INSTALL + "  (per-test time limits when grading)"),
               _package("nbval", "nbval", required=False,
                        fix="pip install -e '.[dev,notebooks]'  (re-running the notebooks)")]
    checks += [check_driver(), *check_cupy(), check_nvcc()]
    return checks


def lab_verdicts(checks: list[Check]) -> list[tuple[str, str, str]]:
    """Returns (lab, needs, verdict) per lab from the checks."""
    by_name = {c.name: c for c in checks}
    base_ok = all(c.ok for c in checks if c.required)
    gpu_ok = all(by_name[n].ok for n in ("GPU", "CuPy") if n in by_name)
    out = []
    for lab in lab_names():
        needs = lab_needs(lab)
        if not base_ok:
            verdict = "cannot run: " + ", ".join(c.name for c in checks if c.required and not c.ok)
        elif needs == "GPU-REQ" and not gpu_ok:
            missing = ", ".join(n for n in ("GPU", "CuPy") if not by_name[n].ok)
            verdict = f"CPU part only: its GPU tests skip here (missing: {missing})"
        else:
            verdict = "runs fully"
        out.append((lab, needs, verdict))
    return out


def main(args: argparse.Namespace) -> int:
    checks = run_checks()
    verdicts = lab_verdicts(checks)
    if args.json:
        import json

        print(json.dumps({"checks": [c.__dict__ for c in checks],
                          "labs": [dict(zip(("lab", "needs", "verdict"), v)) for v in verdicts]},
                         indent=1))
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("MISS" if c.required else "--  ")
            print(f"{mark} {c.name:<15} {c.detail}")
            if c.fix:
                print(f"     {'':<15} fix: {c.fix}")
        print()
        for lab, needs, verdict in verdicts:
            print(f"{lab:<28} [{needs}]  {verdict}")
    return 0 if all(c.ok for c in checks if c.required) else 1
