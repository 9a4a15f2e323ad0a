"""``pagedlab doctor``: what this machine has, and which labs can run here.

Checks Python, the packages the tests need, the notebook extra, the GPU stack (torch's CUDA,
CuPy, the driver, NVRTC, nvcc), the GPU itself and the C++ compiler of the emulated device,
then says per lab whether it runs fully, runs fully on the emulated device (no GPU, g++:
correctness, not speed), runs its CPU part only (GPU tests skip), or cannot run — with the
command that fixes each miss.
Every command fits the machine it runs on: without an NVIDIA GPU it never recommends a CUDA
build (of torch or CuPy); on Linux it recommends torch's CPU build instead.

Exit codes: 0 every lab can at least run its CPU part; 1 something a lab needs is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from reference.tools.labinfo import lab_needs
from reference.paths import lab_names

TORCH_PIN = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pip() -> str:
    """Returns how to call the pip of the interpreter doctor runs in, as the user would type it.

    NOTE: a bare ``pip`` is right only when this interpreter's environment is activated; else
    the fix would install into whatever ``pip`` comes first on PATH.
    """
    found = shutil.which("pip")
    if found and Path(found).resolve().parent == Path(sys.executable).resolve().parent:
        return "pip"
    return f"{sys.executable} -m pip"


def has_nvidia_gpu() -> bool:
    """Returns whether this machine has a working NVIDIA driver with a GPU (nvidia-smi lists one)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


def torch_install(gpu: bool | None = None) -> str:
    """Returns the torch install command that fits this machine.

    Args:
        gpu: whether the machine has an NVIDIA GPU; None means look (:func:`has_nvidia_gpu`).

    Returns:
        On Linux without an NVIDIA GPU, the CPU build from PyTorch's CPU index (the registry's
        Linux wheel is the CUDA build, with about 2.7 GB of CUDA libraries); elsewhere the
        registry's build (CUDA on Linux with a GPU, CPU/MPS on macOS, CPU on Windows).
    """
    gpu = has_nvidia_gpu() if gpu is None else gpu
    if sys.platform.startswith("linux") and not gpu:
        return f"{_pip()} install {TORCH_PIN} --index-url {CPU_INDEX}"
    return f"{_pip()} install {TORCH_PIN}"


def install_dev() -> str:
    """Returns the command that installs the workbook and its test tools."""
    return f"{_pip()} install -e '.[dev]'"


def install_gpu() -> str:
    """Returns the commands that install CuPy and NVRTC (only useful with an NVIDIA GPU)."""
    return (f"{_pip()} install -e '.[gpu]' (NVIDIA driver >= 580, CUDA 13) or "
            f"{_pip()} install -e '.[gpu-cu12]' (CUDA 12 drivers)")


NO_GPU_FIX = ("none here: no NVIDIA GPU on this machine (Labs 4-5's kernel tests run on the "
              "emulated device if g++ is found, below; timing needs a GPU)")


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


def _package(name: str, dist: str, fix: str | None = None, required: bool = True) -> Check:
    version = _version(dist)
    return Check(name, version is not None, version or "not installed",
                 "" if version else (fix or install_dev()), required)


def check_python() -> Check:
    """Python >= 3.10."""
    ok = sys.version_info >= (3, 10)
    return Check("Python", ok, sys.version.split()[0] + f" ({sys.executable})",
                 "" if ok else "install Python 3.10 or newer")


def check_torch(gpu: bool | None = None) -> list[Check]:
    """torch and what it sees of CUDA; every fix fits this machine.

    Args:
        gpu: whether the machine has an NVIDIA GPU; None means look (:func:`has_nvidia_gpu`).

    Returns:
        The torch check and the GPU check.
    """
    gpu = has_nvidia_gpu() if gpu is None else gpu
    try:
        import torch
    except ImportError:
        return [Check("torch", False, "not installed", torch_install(gpu))]
    cuda_build = torch.version.cuda
    torch_check = Check("torch", True, f"{torch.__version__} (CUDA build: {cuda_build or 'no'})")
    if cuda_build and not gpu and sys.platform.startswith("linux"):
        # NOTE: not a miss: the CUDA build runs everything on the CPU. It only costs disk.
        torch_check.fix = ("optional: this CUDA build (with its CUDA libraries, about 4 GB) is "
                           "never used without an NVIDIA GPU; the CPU build is smaller: "
                           f"{_pip()} uninstall -y torch && {torch_install(False)}")
    checks = [torch_check]
    if torch.cuda.is_available():
        checks.append(Check("GPU", True, f"{torch.cuda.get_device_name(0)} × "
                                         f"{torch.cuda.device_count()}", required=False))
    elif not gpu:
        checks.append(Check("GPU", False, "no NVIDIA GPU on this machine", NO_GPU_FIX,
                            required=False))
    else:
        fix = (f"this torch is a CPU build: {_pip()} install --force-reinstall {TORCH_PIN} "
               "--index-url https://download.pytorch.org/whl/cu130" if not cuda_build
               else "no GPU visible to torch: check nvidia-smi and CUDA_VISIBLE_DEVICES")
        checks.append(Check("GPU", False, "torch sees no CUDA GPU", fix, required=False))
    return checks


def check_driver() -> Check:
    """The NVIDIA driver, through nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Check("NVIDIA driver", False, "nvidia-smi not found", NO_GPU_FIX, required=False)
    proc = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True)
    ok = proc.returncode == 0 and proc.stdout.strip() != ""
    detail = proc.stdout.strip().splitlines()[0] if ok else (proc.stderr.strip() or "no GPU")
    return Check("NVIDIA driver", ok, detail, "" if ok else "check the driver: nvidia-smi",
                 required=False)


def check_cupy(gpu: bool | None = None) -> list[Check]:
    """CuPy, the CUDA runtime it was built for, and NVRTC (recommended only with a GPU)."""
    gpu = has_nvidia_gpu() if gpu is None else gpu
    fix = install_gpu() if gpu else NO_GPU_FIX
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 — ImportError or a missing CUDA library
        detail = "not installed" if isinstance(exc, ImportError) else f"broken: {exc}"
        return [Check("CuPy", False, detail, fix, required=False),
                Check("NVRTC", False, "needs CuPy", fix, required=False)]
    checks = [Check("CuPy", True, cupy.__version__, required=False)]
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        checks.append(Check("NVRTC", True, f"{major}.{minor}", required=False))
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("NVRTC", False, f"unusable: {exc}", fix, required=False))
    return checks


def check_nvcc() -> Check:
    """nvcc (optional: NVRTC compiles the kernels; nvcc adds resource reports)."""
    try:
        from reference.tools.compile import nvcc_path
    except ImportError:  # NOTE: compile needs numpy; doctor must report a missing numpy, not die of it
        def nvcc_path() -> str | None:
            return shutil.which("nvcc")

    nvcc = nvcc_path()
    if not nvcc:
        return Check("nvcc", False, "not found (optional: NVRTC compiles kernels at run time)",
                     "install the CUDA toolkit for `pagedlab compile --resources`", required=False)
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return Check("nvcc", True, (out.strip().splitlines() or [nvcc])[-1], required=False)


def check_emulator() -> Check:
    """g++, the emulated device's compiler: with it, Labs 4-5's kernel tests run on the CPU."""
    try:
        from reference.emulate import CXX
    except ImportError:  # NOTE: emulate needs numpy; doctor must report a missing numpy, not die of it
        import os

        CXX = os.environ.get("CXX", "g++")
    cxx = shutil.which(CXX)
    if not cxx:
        return Check("C++ compiler", False, f"{CXX} not found (the emulated device compiles the "
                     "kernels with it)", f"install {CXX} (e.g. apt install g++) to run Labs 4-5's "
                     "kernel tests on the CPU", required=False)
    return Check("C++ compiler", True, f"{cxx}: the emulated device can run Labs 4-5's kernels",
                 "pagedlab grade 4 5 emulates by itself without a GPU; elsewhere set "
                 "PAGEDLAB_DEVICE=emulate (pytest -m emulated)", required=False)


def check_notebooks() -> list[Check]:
    """The notebook extra: Jupyter's kernel and matplotlib (every notebook plots)."""
    fix = f"{_pip()} install -e '.[notebooks]'  (the notebooks in notebooks/)"
    return [_package("matplotlib", "matplotlib", fix=fix, required=False),
            _package("ipykernel", "ipykernel", fix=fix, required=False),
            _package("nbval", "nbval", required=False,
                     fix=f"{install_dev()}  (re-running the notebooks as tests)")]


def run_checks(gpu: bool | None = None) -> list[Check]:
    """Returns every check, in report order.

    Args:
        gpu: whether the machine has an NVIDIA GPU; None means look (:func:`has_nvidia_gpu`).

    Returns:
        The checks: Python and the test packages (required), then notebooks and the GPU stack.
    """
    gpu = has_nvidia_gpu() if gpu is None else gpu
    checks = [check_python(), _package("numpy", "numpy")]
    checks += check_torch(gpu)
    checks += [_package("pytest", "pytest"), _package("hypothesis", "hypothesis"),
               _package("pytest-timeout", "pytest-timeout",
                        required=False, fix=install_dev() + "  (per-test time limits when grading)")]
    checks += check_notebooks()
    checks += [check_driver(), *check_cupy(gpu), check_nvcc(), check_emulator()]
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
            # NOTE: grading emulates only where there is no GPU (a GPU without CuPy is fixed
            # by installing CuPy, not by emulating).
            if not by_name["GPU"].ok and by_name.get("C++ compiler") is not None \
                    and by_name["C++ compiler"].ok:
                verdict = (f"runs fully on the emulated device (correctness, not speed; missing "
                           f"for the GPU: {missing})")
            else:
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
                label = "note" if c.ok or c.fix == NO_GPU_FIX else "fix"
                print(f"     {'':<15} {label}: {c.fix}")
        print()
        for lab, needs, verdict in verdicts:
            print(f"{lab:<28} [{needs}]  {verdict}")
    return 0 if all(c.ok for c in checks if c.required) else 1
