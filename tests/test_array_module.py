"""The device's array library: CuPy on a GPU, NumPy on the emulated device.

The kernel labs' CuPy tests prove "launchers accept the array library's arrays and return the
caller's kind". Emulated, NumPy stands in for CuPy, but only there: off the emulated device a
NumPy array is host memory that no kernel can read, and every launcher must keep refusing it.
No GPU needed. No points: infrastructure.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference import checks
from reference import cuda as rcuda
from reference.emulate import emulation
from reference.errors import DeviceMismatchError
from reference.gpu import array_module


def test_numpy_is_refused_off_the_emulated_device():
    """Without emulation a NumPy array is not a device array: is_cupy says no, as_torch and
    check_array raise TypeError naming the argument, like_input leaves a tensor alone."""
    torch = pytest.importorskip("torch")
    x = np.zeros((2, 3), np.float16)
    with emulation(False):
        assert not rcuda.is_cupy(x)
        with pytest.raises(TypeError, match="ndarray"):
            rcuda.as_torch(x)
        with pytest.raises(TypeError, match="query must be a torch tensor or a CuPy array"):
            checks.check_array("query", x, 2, ("float16",))
        out = torch.ones(2, 3)
        assert rcuda.like_input(out, x) is out


def test_numpy_stands_in_for_cupy_under_emulation():
    """Under emulation a NumPy array is the device's array: as_torch shares its memory (no copy),
    like_input gives a NumPy array back sharing the result's memory, and the launcher checks
    accept it (a CPU array on the emulated device)."""
    torch = pytest.importorskip("torch")
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    with emulation(True):
        assert rcuda.is_cupy(x)
        t = rcuda.as_torch(x)
        assert isinstance(t, torch.Tensor) and t.data_ptr() == x.ctypes.data
        out = torch.zeros(2, 3, dtype=torch.float16)
        back = rcuda.like_input(out, x)
        assert isinstance(back, np.ndarray) and back.ctypes.data == out.data_ptr()
        assert rcuda.like_input(out, t) is out  # a torch caller gets torch back
        checks.check_array("query", x, 2, ("float16",))
        checks.check_on_cuda(query=x, out=out)
        with pytest.raises(ValueError, match="contiguous"):
            checks.check_array("query", x.T, 2, ("float16",))


def test_numpy_is_still_on_the_cpu_for_the_device_check():
    """The device check sees a NumPy array as CPU memory: refused off the emulated device (in
    case a launcher skips the type check), accepted on it."""
    with emulation(False):
        with pytest.raises(DeviceMismatchError, match="query is on cpu"):
            checks.check_on_cuda(query=np.zeros(3, np.float16))


def test_array_module_follows_the_device():
    """array_module() is NumPy under emulation; on a GPU it is CuPy (skipped where CuPy is
    not installed)."""
    with emulation(True):
        assert array_module() is np
    with emulation(False):
        cupy = pytest.importorskip("cupy")
        assert array_module() is cupy


def test_to_host_reads_every_kind():
    """to_host copies a torch tensor and passes NumPy arrays and lists through as NumPy."""
    torch = pytest.importorskip("torch")
    assert to_list(rcuda.to_host(torch.tensor([1, 2]))) == [1, 2]
    assert to_list(rcuda.to_host(np.array([3]))) == [3]
    assert to_list(rcuda.to_host([4, 5])) == [4, 5]


def to_list(a: np.ndarray) -> list:
    assert isinstance(a, np.ndarray), type(a)
    return a.tolist()
