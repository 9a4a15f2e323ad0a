"""A launch asking for more shared memory than the GPU gives one block is an
UnsupportedConfigError naming the kernel, the bytes and the limit, raised before the driver is
touched (it answered CUDA_ERROR_INVALID_VALUE: v6 tuned to 8 warps and 4 stages on an H200,
2026-11-29). No GPU needed: the device limit is mocked. No points: infrastructure."""

from __future__ import annotations

import pytest

from reference import cuda as rcuda
from reference.errors import UnsupportedConfigError

H200_OPTIN = 232_448  # bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin on an H100 / H200


class FakeKernel:
    """What launch reads of a cupy.RawKernel; setting the limit or calling it is a failure."""

    name = "paged_decode_v6"
    attributes = {"shared_size_bytes": 1_120}

    def __init__(self):
        self._limit = 0

    @property
    def max_dynamic_shared_size_bytes(self):
        return self._limit

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self._limit = value

    def __call__(self, *args, **kwargs):
        pytest.fail("launched although the shared memory does not fit")


def test_launch_refuses_shared_memory_past_the_device_limit(monkeypatch):
    """196,608 dynamic + 1,120 static bytes fit (the limit is raised); 262,144 do not: typed
    error naming the kernel, both sizes and the limit; the kernel's limit is left as it was."""
    monkeypatch.setattr(rcuda, "_shared_mem_optin", lambda: H200_OPTIN)
    kernel = FakeKernel()
    rcuda.check_shared_mem(kernel, 196_608)
    with pytest.raises(UnsupportedConfigError) as info:
        rcuda.launch(kernel, (1,), (256,), (), shared_mem=262_144)
    message = str(info.value)
    for part in ("paged_decode_v6", "262144", "1120", str(H200_OPTIN)):
        assert part in message, message
    assert kernel.max_dynamic_shared_size_bytes == 0
    with pytest.raises(UnsupportedConfigError):  # exactly one byte over, counting static
        rcuda.check_shared_mem(kernel, H200_OPTIN - 1_120 + 1)
    rcuda.check_shared_mem(kernel, H200_OPTIN - 1_120)
