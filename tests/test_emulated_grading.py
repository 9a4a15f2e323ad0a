"""Infrastructure (no points): grading the kernel labs on a machine without a GPU.

Lab 5's emulated stand-in lengths keep what a kernel can get wrong about a length, and
``pagedlab grade`` turns the emulated device on by itself only where it should.
"""

from __future__ import annotations

import pytest

from labs.lab05_prefill_kernels._cases import EMU_PERIOD, emulated_length, sized
from reference.emulate import emulation
from reference.grader import grade


@pytest.mark.parametrize("period", sorted(set(EMU_PERIOD.values())))
def test_emulated_length_keeps_the_place_in_tile_and_block(period):
    """Every stand-in ends at the same place in its tile and in its 16- and 32-token block,
    spans more than one tile when the length did, and is never longer than the length."""
    for n in range(0, 1500):
        m = emulated_length(n, period)
        assert m <= n, f"{n} -> {m}: a stand-in must not be longer"
        if n < 2 * period:
            assert m == n, f"{n} -> {m}: lengths under two tiles must stay as written"
            continue
        assert period < m <= 2 * period, f"{n} -> {m}: must span more than one tile"
        for mod in (16, 32, period):
            assert m % mod == n % mod, f"{n} -> {m}: a different place modulo {mod}"


def test_sized_shrinks_only_when_emulating():
    """On the GPU the lengths are used as written; emulated, per the kernel's period."""
    lengths = [0, 1, 63, 65, 127, 129, 300, 700]
    with emulation(False):
        assert sized(lengths, "naive") == lengths
    with emulation(True):
        assert sized(lengths, None) == lengths
        assert sized(lengths, "tiled") == [0, 1, 63, 65, 127, 65, 108, 124]
        assert sized(lengths, "naive") == [0, 1, 63, 33, 63, 33, 44, 60]


def _no_gpu(monkeypatch, why="no CUDA GPU visible to torch"):
    monkeypatch.setattr("reference.gpu.gpu_skip_reason", lambda: why)
    monkeypatch.setattr(grade, "_emulator_missing", lambda: False)


def test_grade_emulates_kernel_labs_without_a_gpu(monkeypatch):
    """No GPU and PAGEDLAB_DEVICE unset: a grade of Lab 4 turns emulation on, in one line."""
    _no_gpu(monkeypatch)
    monkeypatch.delenv("PAGEDLAB_DEVICE", raising=False)
    line = grade._emulate_kernel_labs_without_gpu(["lab04_decode_kernels"])
    assert line and "lab04_decode_kernels" in line and "emulated" in line and "\n" not in line
    import os

    assert os.environ["PAGEDLAB_DEVICE"] == "emulate"


@pytest.mark.parametrize("labs, env", [(["lab01_block_manager"], None),
                                       (["lab05_prefill_kernels"], "gpu"),
                                       (["lab05_prefill_kernels"], "emulate")])
def test_grade_leaves_the_device_alone(monkeypatch, labs, env):
    """No kernel lab in the grade, or PAGEDLAB_DEVICE already chosen: nothing changes."""
    _no_gpu(monkeypatch)
    if env is None:
        monkeypatch.delenv("PAGEDLAB_DEVICE", raising=False)
    else:
        monkeypatch.setenv("PAGEDLAB_DEVICE", env)
    assert grade._emulate_kernel_labs_without_gpu(labs) is None
    import os

    assert os.environ.get("PAGEDLAB_DEVICE") == env


def test_grade_with_a_gpu_does_not_emulate(monkeypatch):
    """With a GPU the kernel tests run on it, as before."""
    monkeypatch.setattr("reference.gpu.gpu_skip_reason", lambda: None)
    monkeypatch.delenv("PAGEDLAB_DEVICE", raising=False)
    assert grade._emulate_kernel_labs_without_gpu(["lab04_decode_kernels"]) is None


def test_compile_tells_an_sm80_feature_from_a_real_error():
    """On sm_75, ptxas errors that only name sm_80 features make the file "needs sm_80" (an
    UnsupportedConfigError message naming them), never hiding any other compile error."""
    from pathlib import Path

    from reference.tools.compile import sm80_features, unsupported_on

    log = ("ptxas k.ptx, line 7; error   : Feature '.m16n8k16' requires .target sm_80 or higher\n"
           "ptxas k.ptx, line 9; error   : Feature 'cp.async' requires .target sm_80 or higher\n"
           "ptxas fatal   : Ptx assembly aborted due to errors")
    assert sm80_features(log) == ["cp.async", "mma.sync m16n8k16"]
    assert sm80_features(log + "\nk.cu(3): error: identifier \"x\" is undefined") is None
    assert sm80_features("") is None
    msg = unsupported_on("sm_75", Path("decode_v6.cu"), ["cp.async"])
    assert msg.startswith("UnsupportedConfigError") and "sm_80" in msg and "decode_v6.cu" in msg
