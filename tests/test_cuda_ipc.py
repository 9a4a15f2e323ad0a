"""The CUDA IPC message of the grading boundary, on the CPU: the payload a storage crosses as,
its checks, and the view rebuilt from it (the driver calls are faked; tests/test_proxy.py has
the real round trips, which run on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reference.grader import cuda_ipc  # noqa: E402
from reference.grader.codec import Codec  # noqa: E402
from reference.grader.cuda_ipc import CudaIpc, CudaIpcError  # noqa: E402

HANDLE = bytes(range(64))


class _FakeStorage:
    """A CUDA storage as the sender sees it: ``_share_cuda_`` gives the driver's handle."""

    def __init__(self, nbytes: int) -> None:
        self.real = torch.UntypedStorage(nbytes)
        self.shares = 0

    def nbytes(self) -> int:
        return self.real.nbytes()

    def data_ptr(self) -> int:
        return self.real.data_ptr()

    def _share_cuda_(self):
        self.shares += 1
        return (0, HANDLE, self.real.nbytes(), 0, b"/torch_1_ref", 3, b"", False)


class _FakeCudaTensor:
    """A CUDA tensor as the codec sees it: a CPU tensor's geometry on a fake storage."""

    is_cuda = True

    def __init__(self, t, storage: _FakeStorage) -> None:
        self.t, self.storage = t, storage
        self.dtype, self.shape, self.layout, self.device = t.dtype, t.shape, t.layout, "cuda:0"

    def untyped_storage(self):
        return self.storage

    def stride(self):
        return self.t.stride()

    def storage_offset(self):
        return self.t.storage_offset()

    def element_size(self):
        return self.t.element_size()


@pytest.fixture
def faked(monkeypatch):
    """No driver: synchronize does nothing, an open maps a fresh CPU storage (counted)."""
    opened = []

    def fake_open(device, handle, size_bytes, offset_bytes):
        opened.append((device, handle, size_bytes, offset_bytes))
        return torch.UntypedStorage(size_bytes)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(cuda_ipc, "_open", fake_open)
    return opened


def test_a_view_crosses_as_its_storage_handle_and_its_geometry(faked):
    """The payload carries the storage's handle once per storage and the view's dtype, shape,
    strides and byte offset; the receiver opens each storage once and rebuilds the same view."""
    base = torch.arange(24, dtype=torch.float16)
    storage = _FakeStorage(base.untyped_storage().nbytes())
    sender, receiver = CudaIpc(), CudaIpc()
    for view in (base.view(4, 6).t(), base.view(4, 6)[:, 1::2], base[3:].view(3, 7)):
        payload = sender.reference(_FakeCudaTensor(view, storage))
        assert payload[0] == "own" and payload[2:6] == [0, HANDLE, 48, 0]
        got = receiver.view(payload)
        assert (list(got.stride()), got.storage_offset(), list(got.shape)) == \
            (list(view.stride()), view.storage_offset(), list(view.shape))
    assert storage.shares == 1, "a storage was shared again: each share costs a handle"
    assert len(faked) == 1, "a storage was opened again: reopening a handle is refused"


def test_a_storage_sent_back_is_the_senders_own(faked):
    """A received storage handed back crosses as the sender's token (CUDA refuses to re-share a
    received storage) and arrives as a view of the sender's very storage."""
    base = torch.arange(8, dtype=torch.float32)
    storage = _FakeStorage(base.untyped_storage().nbytes())
    sender, receiver = CudaIpc(), CudaIpc()
    got = receiver.view(sender.reference(_FakeCudaTensor(base, storage)))
    back = receiver.reference(got[2:])
    assert back[0] == "peer" and len(back) == 6
    sender._sent[back[1]] = storage.real  # NOTE: the fake stands for this real storage
    mine = sender.view(back)
    assert mine.untyped_storage().data_ptr() == storage.data_ptr()
    assert mine.storage_offset() == 2 and receiver.is_shared(got) is False  # a CPU tensor here


def test_a_share_that_fails_is_raised_with_its_reason_never_copied(faked):
    """An IPC failure is an error naming the driver's reason and what CUDA IPC needs; the codec
    has no copy to fall back to (a CPU tensor still crosses as before)."""
    both = Codec(lambda o: [0], lambda p: None, cuda=CudaIpc())
    assert torch.equal(both.unpack(both.pack(torch.arange(3))), torch.arange(3))
    fake = _FakeCudaTensor(torch.arange(4, dtype=torch.float32), _FakeStorage(16))

    def broken():
        raise RuntimeError("cudaIpcGetMemHandle: invalid argument")

    fake.storage._share_cuda_ = broken
    with pytest.raises(CudaIpcError, match="invalid argument.*same host"):
        CudaIpc().reference(fake)


@pytest.mark.parametrize("mutate, why", [
    (lambda p: p.__setitem__(3, b"short"), "handle"),
    (lambda p: p.__setitem__(1, "../../etc"), "token"),
    (lambda p: p.__setitem__(4, -1), "handle"),
    (lambda p: p.__setitem__(7, [1000]), "ending at byte"),
    (lambda p: p.__setitem__(9, 2), "misaligned"),
    (lambda p: p.__setitem__(6, "torch.float32\x00"), "not a torch dtype"),
    (lambda p: p.__setitem__(8, [1, 1]), "malformed"),
    (lambda p: p.__setitem__(0, "peer"), "malformed"),
])
def test_a_malformed_payload_is_refused_with_its_reason(faked, mutate, why):
    """The receiver (the trusted side, for the worker's tensors) opens nothing for a payload that
    is not well formed, and maps no view reaching past the storage."""
    t = torch.arange(4, dtype=torch.float32)
    payload = CudaIpc().reference(_FakeCudaTensor(t, _FakeStorage(16)))
    mutate(payload)
    with pytest.raises((CudaIpcError, TypeError), match=why):
        CudaIpc().view(payload)


def test_a_peer_token_never_sent_is_refused(faked):
    """The other side cannot name a storage of ours it was never given."""
    with pytest.raises(CudaIpcError, match="never sent"):
        CudaIpc().view(["peer", "0" * 32, "torch.float32", [1], [1], 0])


def test_a_claimed_storage_larger_than_its_allocation_is_refused(monkeypatch):
    """A storage claiming more bytes than the allocation its handle maps is refused after the
    driver's address-range check, before any view of it exists."""
    real = torch.UntypedStorage(64)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared_cuda",
                        staticmethod(lambda *a: real), raising=False)
    monkeypatch.setattr(cuda_ipc, "allocation_range", lambda ptr: (real.data_ptr(), 32))
    with pytest.raises(CudaIpcError, match="64 bytes at offset 0 of an allocation of 32"):
        cuda_ipc._open(0, HANDLE, 64, 0)
    with pytest.raises(CudaIpcError, match="device 3.*sees 1"):
        cuda_ipc._open(3, HANDLE, 64, 0)
