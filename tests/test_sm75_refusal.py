"""Stages that need sm_80 refuse on an older GPU (a Colab or Kaggle T4 is sm_75) before CuPy
compiles them, with an UnsupportedConfigError that names the stage, what it needs and where to
run it. No GPU needed: the device's compute capability is mocked. No points: infrastructure."""

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
