"""Infrastructure (no points): `pagedlab doctor` recommends only what fits the machine it runs on."""

from __future__ import annotations

import sys
import types

import pytest

from reference.tools import doctor

CUDA_HINTS = ("cu130", "cu12", "cuda13x", "cuda12x", "'.[gpu")


def _fake_torch(monkeypatch, cuda: str | None, available: bool) -> None:
    """Installs a stand-in ``torch`` module: a CPU or CUDA build that does or does not see a GPU."""
    fake = types.SimpleNamespace(
        __version__="2.13.0" + ("" if cuda else "+cpu"),
        version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(is_available=lambda: available, device_count=lambda: 1,
                                   get_device_name=lambda i: "Fake GPU"))
    monkeypatch.setitem(sys.modules, "torch", fake)


def _fixes(checks) -> str:
    return "\n".join(c.fix for c in checks)


@pytest.mark.parametrize("cuda", [None, "13.0"], ids=["cpu-build", "cuda-build"])
def test_no_cuda_build_is_recommended_without_a_gpu(monkeypatch, cuda):
    """On a machine with no NVIDIA GPU, no fix names a CUDA build of torch or CuPy, whichever
    torch build is installed."""
    _fake_torch(monkeypatch, cuda, available=False)
    fixes = _fixes(doctor.run_checks(gpu=False))
    hits = [h for h in CUDA_HINTS if h in fixes]
    assert not hits, f"doctor recommends a CUDA build on a machine without a GPU ({hits}):\n{fixes}"


def test_missing_torch_on_linux_without_gpu_points_to_the_cpu_index(monkeypatch):
    """Without torch, Linux without a GPU is sent to PyTorch's CPU index (the registry's Linux
    wheel is the CUDA build); a machine with a GPU gets the registry's build."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setattr(sys, "platform", "linux")
    cpu = {c.name: c for c in doctor.run_checks(gpu=False)}["torch"]
    assert not cpu.ok and doctor.CPU_INDEX in cpu.fix, cpu.fix
    gpu = {c.name: c for c in doctor.run_checks(gpu=True)}["torch"]
    assert "torch==2.13.0" in gpu.fix and "--index-url" not in gpu.fix, gpu.fix


def test_cuda_build_without_gpu_is_ok_but_names_the_smaller_cpu_build(monkeypatch):
    """A CUDA build on a CPU-only Linux machine works (not a miss); the note offers the CPU build."""
    _fake_torch(monkeypatch, "13.0", available=False)
    monkeypatch.setattr(sys, "platform", "linux")
    torch_check = {c.name: c for c in doctor.run_checks(gpu=False)}["torch"]
    assert torch_check.ok and doctor.CPU_INDEX in torch_check.fix, torch_check


def test_cpu_build_on_a_gpu_machine_recommends_the_cuda_build(monkeypatch):
    """With an NVIDIA GPU and a CPU build of torch, doctor says how to get the CUDA build."""
    _fake_torch(monkeypatch, None, available=False)
    gpu_check = {c.name: c for c in doctor.run_checks(gpu=True)}["GPU"]
    assert not gpu_check.ok and "cu130" in gpu_check.fix, gpu_check


def test_the_notebook_extra_is_checked():
    """doctor checks what the notebooks need (matplotlib, ipykernel) and names the extra."""
    checks = {c.name: c for c in doctor.run_checks(gpu=False)}
    for name in ("matplotlib", "ipykernel"):
        assert name in checks, f"doctor does not check {name}, which every notebook needs"
        assert checks[name].ok or ".[notebooks]" in checks[name].fix


def test_doctor_reports_a_missing_numpy_instead_of_dying_of_it(monkeypatch):
    """With numpy (or torch) missing — a half-finished install — doctor still runs every check
    and reports the miss with its fix (found by .ci/python_versions.sh on a bare install)."""
    for name in ("numpy", "torch"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    for name in ("reference.tools.compile", "reference.cuda"):  # re-imported without numpy
        monkeypatch.delitem(sys.modules, name, raising=False)
    checks = {c.name: c for c in doctor.run_checks(gpu=False)}
    assert "nvcc" in checks
    assert not checks["torch"].ok and checks["torch"].fix


@pytest.mark.parametrize("has_cxx", [True, False], ids=["g++", "no-g++"])
def test_without_a_gpu_the_kernel_labs_run_on_the_emulated_device_when_gxx_is_there(
        monkeypatch, has_cxx):
    """No GPU: with g++ (the emulated device's compiler) doctor says Labs 4-5 run fully on the
    emulated device; without it, that only their CPU part runs, and how to get g++."""
    from reference import emulate

    real_which = doctor.shutil.which
    monkeypatch.setattr(doctor.shutil, "which", lambda name: (
        ("/usr/bin/" + name if has_cxx else None) if name == emulate.CXX else real_which(name)))
    checks = doctor.run_checks(gpu=False)
    cxx = {c.name: c for c in checks}["C++ compiler"]
    assert cxx.ok == has_cxx and not cxx.required
    verdicts = {lab: verdict for lab, needs, verdict in doctor.lab_verdicts(checks)
                if needs == "GPU-REQ"}
    assert verdicts, "Labs 4-5 are GPU-REQ"
    for lab, verdict in verdicts.items():
        if not all(c.ok for c in checks if c.required):
            continue  # this machine lacks a required package: "cannot run" comes first
        want = "runs fully on the emulated device" if has_cxx else "CPU part only"
        assert want in verdict, (lab, verdict)
    if not has_cxx:
        assert "g++" in cxx.fix, cxx.fix
