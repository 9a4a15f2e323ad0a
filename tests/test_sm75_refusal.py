"""Stages that need sm_80 refuse on an older GPU (a Colab or Kaggle T4 is sm_75) before CuPy
compiles them, with an UnsupportedConfigError that names the stage, what it needs and where to
run it; their tests skip there with that reason (reference/capability_skip.py), and fail on
sm_80+. No GPU needed: the device's compute capability is mocked. No points: infrastructure."""

from __future__ import annotations

import pytest

from reference import cuda as rcuda
from reference.errors import UnsupportedConfigError
from reference.paths import REPO_ROOT, SOLUTIONS_DIR

LAB4, LAB5 = "lab04_decode_kernels", "lab05_prefill_kernels"
SM80 = {"decode_v5.cu": ["mma.sync m16n8k16"],
        "decode_v6.cu": ["mma.sync m16n8k16", "cp.async"],
        "prefill_tc.cu": ["mma.sync m16n8k16", "cp.async"]}  # at least these (and ldmatrix)
CUDA_CORE = ["decode_naive.cu", "decode_v0.cu", "decode_v1.cu", "decode_v2.cu", "decode_v3.cu",
             "decode_v4.cu", "decode_reduce.cu", "prefill_naive.cu", "prefill_tiled.cu"]


def _files(name: str):
    lab = LAB5 if name.startswith("prefill") else LAB4
    found = [p for p in (SOLUTIONS_DIR / lab / name, REPO_ROOT / "labs" / lab / name) if p.exists()]
    assert found, f"{name} is in neither the solution nor the starter folder"
    return found


@pytest.mark.parametrize("name", sorted(SM80))
def test_tensor_core_and_cp_async_stages_refuse_on_sm75(name, monkeypatch):
    """On a 7.5 device, loading a stage that uses mma.sync / ldmatrix / cp.async raises before
    any compile (CuPy is never touched), naming the kernel, its file, the features and 8.0,
    and pointing to an sm_80+ GPU or the emulated device. A starter file is refused alike as
    soon as it uses one of them (what the student writes decides, not the file name)."""
    monkeypatch.setattr(rcuda, "device_capability", lambda: (7, 5))
    monkeypatch.setattr(rcuda, "_compile", lambda *a, **k: pytest.fail("compiled on sm_75"))
    for path in _files(name):
        features = rcuda.sm80_features(path)
        if path.is_relative_to(SOLUTIONS_DIR):
            assert set(SM80[name]) <= set(features), (path, features)
        elif not features:
            continue  # a starter before the student writes the tensor-core part
        with pytest.raises(UnsupportedConfigError) as info:
            rcuda.get_kernel(path, "the_kernel")
        msg = str(info.value)
        for part in ("kernel the_kernel", name, "compute capability 8.0", "sm_80", "7.5",
                     "PAGEDLAB_DEVICE=emulate", *features):
            assert part in msg, f"{part!r} missing from: {msg}"


@pytest.mark.parametrize("name", CUDA_CORE)
def test_cuda_core_stages_run_on_sm75(name):
    """The CUDA-core stages use nothing sm_80-only: a T4 runs them (no refusal)."""
    for path in _files(name):
        assert rcuda.sm80_features(path) == [], path
        rcuda.check_capability(path, "k", capability=(7, 5))


def test_sm80_and_newer_run_every_stage():
    """From compute capability 8.0 on (A100, L4, H100), nothing is refused."""
    for name in SM80:
        for path in _files(name):
            for cap in ((8, 0), (8, 9), (9, 0), (10, 0)):
                rcuda.check_capability(path, "k", capability=cap)


def test_comments_do_not_count(tmp_path):
    """A feature named only in a comment is not a use of it."""
    cu = tmp_path / "k.cu"
    cu.write_text("// mma_16816(...) would be faster\n/* cp_async_16 */\nextern \"C\" __global__ "
                  "void k() {}\n")
    assert rcuda.sm80_features(cu) == []
    rcuda.check_capability(cu, "k", capability=(7, 5))


# --- On a GPU below 8.0 the tests of sm_80 stages skip (reference/capability_skip.py) ---------

from reference.capability_skip import capability_skip_reason  # noqa: E402
from reference.emulate import emulation  # noqa: E402
from reference.errors import ComputeCapabilityError  # noqa: E402

V6 = SOLUTIONS_DIR / LAB4 / "decode_v6.cu"


def _refusal(monkeypatch, capability) -> ComputeCapabilityError:
    monkeypatch.setattr(rcuda, "device_capability", lambda: capability)
    with pytest.raises(ComputeCapabilityError) as info:
        rcuda.check_capability(V6, "paged_decode_v6")
    return info.value


def test_refusal_on_sm75_becomes_a_skip_reason(monkeypatch):
    """On a 7.5 GPU the refusal of an sm_80 stage is a skip reason that says what the stage
    needs and what this GPU is, followed by the refusal itself."""
    exc = _refusal(monkeypatch, (7, 5))
    assert (exc.required, exc.capability) == ("8.0", "7.5")
    with emulation(False):
        reason = capability_skip_reason(exc)
    assert reason is not None and reason.startswith(
        "needs compute capability 8.0 (this GPU is 7.5): "), reason
    assert "decode_v6.cu" in reason and "mma.sync m16n8k16" in reason


def test_the_same_error_fails_on_sm80_and_newer_and_emulated(monkeypatch):
    """The skip rests on the live device: on 8.0 and newer (and on the emulated device, which
    runs every stage) a ComputeCapabilityError is a bug — e.g. a student's kernel raising it
    itself — and fails; so does any other UnsupportedConfigError on a 7.5 GPU."""
    exc = _refusal(monkeypatch, (7, 5))
    with emulation(False):
        for cap in ((8, 0), (8, 9), (9, 0)):
            monkeypatch.setattr(rcuda, "device_capability", lambda cap=cap: cap)
            assert capability_skip_reason(exc) is None, cap
        monkeypatch.setattr(rcuda, "device_capability", lambda: (7, 5))
        assert capability_skip_reason(UnsupportedConfigError("head_size 96")) is None
    with emulation(True):
        assert capability_skip_reason(exc) is None


_SESSION = '''
import pytest
from reference import cuda as rcuda
from reference.errors import ComputeCapabilityError, UnsupportedConfigError
from reference.paths import SOLUTIONS_DIR

LAB4, LAB5 = SOLUTIONS_DIR / "lab04_decode_kernels", SOLUTIONS_DIR / "lab05_prefill_kernels"


@pytest.fixture(autouse=True)
def device(monkeypatch):
    cap = tuple(int(p) for p in "{cap}".split("."))
    monkeypatch.setattr(rcuda, "device_capability", lambda: cap)
    monkeypatch.setattr(rcuda, "_compile", lambda *a, **k: "compiled")  # stands in for CuPy


@pytest.mark.parametrize("path, name", [(LAB4 / "decode_v5.cu", "paged_decode_v5"),
                                        (LAB4 / "decode_v6.cu", "paged_decode_v6"),
                                        (LAB5 / "prefill_tc.cu", "prefill_tc")])
def test_sm80_stage(path, name):
    assert rcuda.load_module(path, kernel_name=name) == "compiled"


@pytest.mark.parametrize("path", [LAB4 / "decode_v4.cu", LAB5 / "prefill_tiled.cu"])
def test_cuda_core_stage(path):
    assert rcuda.load_module(path, kernel_name="k") == "compiled"


def test_student_raises_capability_error():
    raise ComputeCapabilityError("my kernel needs 8.0", required="8.0", capability="?")


def test_student_raises_other_config_error():
    raise UnsupportedConfigError("head_size 96 is not supported")
'''


def _run_session(tmp_path, cap: str) -> dict[str, tuple[str, str]]:
    """Runs _SESSION with the plugin on a GPU reporting ``cap``; returns name -> (outcome, text)."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    folder = tmp_path / cap
    folder.mkdir()
    (folder / "test_session.py").write_text(_SESSION.replace("{cap}", cap))
    env = {k: v for k, v in os.environ.items() if k not in ("PAGEDLAB_DEVICE", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "reference.capability_skip", "-p",
         "no:cacheprovider", "-q", f"--junit-xml={folder / 'report.xml'}", "--rootdir",
         str(folder), "test_session.py"], cwd=folder, env=env, capture_output=True, text=True,
        timeout=300)
    assert (folder / "report.xml").exists(), proc.stdout + proc.stderr
    results = {}
    for case in ET.parse(folder / "report.xml").getroot().iter("testcase"):
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                outcome, text = child.tag, child.get("message", "")
        results[case.get("name")] = (outcome, text)
    return results


@pytest.mark.slow  # two pytest sessions in subprocesses: ~20 s on 2 cores
def test_sm80_stage_tests_skip_on_sm75_and_run_on_sm90(tmp_path):
    """A pytest session with the plugin, on a GPU that reports 7.5 (mocked): the tests that load
    v5, v6 and the tensor-core prefill skip with "needs compute capability 8.0 (this GPU is
    7.5)"; the CUDA-core stages run; a ComputeCapabilityError raised on a 9.0 GPU fails (a
    student's kernel that wrongly refuses), and so does another UnsupportedConfigError on
    either. On 9.0 nothing is skipped."""
    sm75 = _run_session(tmp_path, "7.5")
    sm80 = ("test_sm80_stage[path0-paged_decode_v5]", "test_sm80_stage[path1-paged_decode_v6]",
            "test_sm80_stage[path2-prefill_tc]")
    for name in sm80:
        outcome, text = sm75[name]
        assert outcome == "skipped", (name, sm75[name])
        assert "needs compute capability 8.0 (this GPU is 7.5)" in text, text
    for name in ("test_cuda_core_stage[path0]", "test_cuda_core_stage[path1]"):
        assert sm75[name][0] == "passed", (name, sm75[name])
    assert sm75["test_student_raises_other_config_error"][0] == "failure"

    sm90 = _run_session(tmp_path, "9.0")
    assert not [n for n, (outcome, _) in sm90.items() if outcome == "skipped"], sm90
    for name in sm80 + ("test_cuda_core_stage[path0]", "test_cuda_core_stage[path1]"):
        assert sm90[name][0] == "passed", (name, sm90[name])
    assert sm90["test_student_raises_capability_error"][0] == "failure"
    assert sm90["test_student_raises_other_config_error"][0] == "failure"


def test_paged_attention_and_plans_pick_v4_below_sm80(monkeypatch):
    """On a GPU below 8.0 (mocked) the dispatcher and ``plan_decode`` choose v4 for shapes v6
    would serve, so a T4 runs Lab 4's production path instead of skipping it; on 8.0+ they
    choose v6 (the CPU case stands in for the GPU's tensors, emulated)."""
    from labs.lab04_decode_kernels._cases import GpuCase
    from reference import emulate
    from reference.loader import load_impl

    impl = load_impl(LAB4, "solution")
    with emulate.emulation():
        case = GpuCase(3, [20, 40], 8, 2, 128, 16)
        calls = []
        monkeypatch.setattr(impl, "paged_attention_v4", lambda *a, **k: calls.append("v4"))
        monkeypatch.setattr(impl, "paged_attention_v6", lambda *a, **k: calls.append("v6"))
        for sm80, want in ((False, "v4"), (True, "v6")):
            monkeypatch.setattr(rcuda, "runs_sm80_stages", lambda x, ok=sm80: ok)
            impl.paged_attention(*case.args(), case.scale)
            assert calls[-1] == want, f"runs_sm80_stages={sm80}: dispatched to {calls[-1]}"
            assert impl.plan_decode(*case.args(), case.scale).version == want


def test_runs_sm80_stages_reads_the_tensors_gpu(monkeypatch):
    """``runs_sm80_stages`` asks the tensor's own GPU (mocked 7.5 / 8.0), and answers True for
    CPU tensors (the launcher's device check or the emulator decides those)."""
    torch = pytest.importorskip("torch")

    class FakeCuda:
        type = "cuda"
        index = 0

    class Tensor:
        device = FakeCuda()

    for cap, want in (((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=cap: c)
        assert rcuda.runs_sm80_stages(Tensor()) is want
    assert rcuda.runs_sm80_stages(torch.zeros(1)) is True
