"""Test helpers for Lab 4: decode cases on the GPU, the float64 oracle, and teaching comparisons.

Tolerance (documented in the handout): the kernels read fp16/bf16 K/V and accumulate in fp32,
so against the float64 oracle — computed on the *same* rounded inputs — the relative error
``||out - ref|| / ||ref||`` must stay under ``REL_TOL`` and no element may be off by more than
``ABS_TOL[dtype]``. Seen in practice: about 2e-4 (fp16) and 2e-3 (bf16). NaN never passes: every
unused block and every row past a sequence's last token is NaN in these caches, and the output
buffer is NaN before the call, so a read too many or an element never written shows as NaN.
"""

from __future__ import annotations

import numpy as np

from reference.inputs import make_decode_case
from reference.oracle import paged_decode_ref

REL_TOL = 1e-2
ABS_TOL = {"float16": 1e-2, "bfloat16": 5e-2}


def torch_dtype(name: str):
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]


class GpuCase:
    """One decode batch on the GPU plus its float64 reference.

    Attributes:
        query, key_cache, value_cache, block_tables, context_lens: CUDA tensors.
        ref: [num_seqs, num_q_heads, head_size] float64 oracle output.
        lse: [num_seqs, num_q_heads] float64 oracle log-sum-exp.
        scale: softmax scale.
    """

    def __init__(self, seed, context_lens, num_q_heads, num_kv_heads, head_size, block_size, *,
                 dtype="float16", q_scale=1.0, **kv_kwargs):
        import torch

        from reference.gpu import kernel_device

        device = kernel_device()  # "cuda", or "cpu" on the emulated device
        case = make_decode_case(seed, context_lens, num_q_heads, num_kv_heads, head_size,
                                block_size, dtype=np.float32, **kv_kwargs)
        td = torch_dtype(dtype)
        self.dtype = dtype
        self.scale = case.scale
        self.query = (torch.from_numpy(case.query) * q_scale).to(device, td)
        self.key_cache = torch.from_numpy(case.kv.key_cache).to(device, td)
        self.value_cache = torch.from_numpy(case.kv.value_cache).to(device, td)
        self.block_tables = torch.from_numpy(case.kv.block_tables).to(device)
        self.context_lens = torch.from_numpy(case.kv.context_lens).to(device)
        self.host_tables = case.kv.block_tables
        self.host_lens = case.kv.context_lens
        # The reference sees exactly the rounded values the kernel sees.
        self.ref, self.lse = paged_decode_ref(
            self.query.float().cpu().numpy(), self.key_cache.float().cpu().numpy(),
            self.value_cache.float().cpu().numpy(), case.kv.block_tables, case.kv.context_lens,
            self.scale)

    def args(self):
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.context_lens)

    def poisoned_out(self):
        """An output buffer full of NaN: an element the kernel never writes stays NaN."""
        import torch

        return torch.full_like(self.query, float("nan"))


def assert_matches(got, ref, lens, dtype: str, what: str) -> None:
    """Asserts ``got`` (any array-like) matches the oracle ``ref``; the message teaches.

    Args:
        got: [num_seqs, num_q_heads, head_size] kernel output (torch, CuPy or NumPy).
        ref: the oracle output, float64.
        lens: context lengths (to name the first bad sequence's length).
        dtype: the kernel's dtype name (picks ABS_TOL).
        what: a few words naming the kernel and case, for the message.
    """
    if hasattr(got, "detach"):
        got = got.detach().float().cpu().numpy()
    elif type(got).__module__.startswith("cupy"):
        got = got.astype("float32").get()
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: output shape {got.shape}, expected {ref.shape}"
    if not np.isfinite(got).all():
        s, h, d = np.argwhere(~np.isfinite(got))[0]
        raise AssertionError(
            f"{what}: output[{s}, {h}, {d}] is {got[s, h, d]} (context_len={lens[s]}). NaN means "
            "the kernel read a poisoned value — a row past the sequence's last token, an unused "
            "block, a wrong block-table entry, shared memory read before any thread wrote it "
            "(a missing __syncthreads(); emulated, fresh shared memory is NaN) — or never wrote "
            "that element of the output.")
    diff = np.abs(got - ref)
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    worst = np.unravel_index(np.argmax(diff), diff.shape)
    bad_heads = np.argwhere(diff.max(axis=-1) > ABS_TOL[dtype])
    if rel >= REL_TOL or len(bad_heads):
        s, h = bad_heads[0] if len(bad_heads) else worst[:2]
        raise AssertionError(
            f"{what}: relative error {rel:.2e} (limit {REL_TOL:.0e}), max abs error "
            f"{diff.max():.2e} at output{tuple(int(i) for i in worst)} (limit {ABS_TOL[dtype]:.0e}); "
            f"first bad (seq, head) = ({s}, {h}) with context_len={lens[s]}: got "
            f"{np.round(got[s, h, :4], 4)}..., expected {np.round(ref[s, h, :4], 4)}...")


def assert_exact_zeros(got, seqs, what: str) -> None:
    """The zero-length contract: every output element of the given sequences is exactly 0."""
    if hasattr(got, "detach"):
        got = got.detach().float().cpu().numpy()
    for s in seqs:
        row = np.asarray(got[s], dtype=np.float64)
        assert (row == 0).all(), (
            f"{what}: sequence {s} has context_len 0, so its output must be exactly 0 (Lab 3's "
            f"contract), got {row.ravel()[:4]}... — NaN means it was never written (an early "
            "return before the store?), 0/0 shows as NaN too")


# ----------------------------------------------------------------------------- given helpers
# NOTE: tests call these through ``reference.grader.proxy.given``, so they run where the
# student's code runs: grading isolated, a CuPy out= could not be shared with the worker, nor
# could launches be recorded in the test's process.


def fill_array_out(version: str, args: list, scale: float, return_lse: bool):
    """Calls ``KERNELS[version]`` on CuPy (emulated: NumPy) copies of ``args`` with a NaN-filled
    array ``out=``.

    Returns:
        ``(out as a torch tensor, whether lse came back as an array or None)``.
    """
    import torch

    from reference.gpu import array_module, synchronize
    from reference.loader import load_impl

    xp = array_module()
    arrays = [xp.from_dlpack(t) for t in args]
    out = xp.full(tuple(arrays[0].shape), np.nan, dtype=arrays[0].dtype)
    launch = load_impl("lab04_decode_kernels").KERNELS[version]
    lse_is_array = None
    if return_lse:
        _, lse = launch(*arrays, scale, out=out, return_lse=True)
        lse_is_array = isinstance(lse, xp.ndarray)
    else:
        launch(*arrays, scale, out=out)
    synchronize()
    return torch.from_dlpack(out).clone(), lse_is_array


def record_launches_of(version: str, args: list, scale: float, **kwargs) -> list:
    """The launches ``KERNELS[version](*args, scale, **kwargs)`` makes, recorded, not run.

    Returns:
        One ``(grid, block, compile options)`` per launch.
    """
    from reference import cuda as rcuda
    from reference.loader import load_impl

    launch = load_impl("lab04_decode_kernels").KERNELS[version]
    with rcuda.capture_launches() as (launches, _):
        launch(*args, scale, **kwargs)
    return [(tuple(r.grid), tuple(r.block), list(rcuda.kernel_origin(r.kernel)[0].options))
            for r in launches]


# ----------------------------------------------------------------------------- the 4 GiB cache


def _sparse_host_cache(shape, poisoned_blocks: int):
    """A CPU fp16 tensor of ``shape`` on an anonymous memory map: pages cost memory only once
    written, so a 4 GiB cache holds just the blocks a test fills. Untouched blocks read as 0;
    the first ``poisoned_blocks`` (where a wrapped 32-bit offset lands) are NaN."""
    import mmap

    import torch

    nbytes = int(np.prod(shape)) * 2
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    cache = torch.frombuffer(buf, dtype=torch.float16).view(shape)
    cache[:poisoned_blocks] = float("nan")
    return cache


def big_cache_case(emulated: bool) -> GpuCase:
    """A paged cache of 2^31 + 2^23 fp16 elements (4.02 GiB each for K and V); sequence 0 lives
    at the very top of the pool, sequence 1 at the bottom, sequence 2 alternates. Emulated, the
    caches are sparse host memory maps (the emulator copies in only the pages a kernel reads:
    the offsets are the GPU's, the memory is a few MiB); on the GPU, NaN-filled CUDA tensors.

    Args:
        emulated: build it for the emulated device (CPU memory maps) instead of the GPU.
    """
    import torch

    small = GpuCase(101, [100, 37, 64], 4, 1, 128, 16)
    num_blocks = 2**20 + 4096
    shape = (num_blocks, 1, 16, 128)
    if emulated:
        key_cache = _sparse_host_cache(shape, 64)
        value_cache = _sparse_host_cache(shape, 64)
    else:
        key_cache = torch.full(shape, float("nan"), dtype=torch.float16, device="cuda")
        value_cache = torch.full(shape, float("nan"), dtype=torch.float16, device="cuda")
    tables = small.host_tables.copy()
    top, bottom = num_blocks - 1, 5
    for s, n in enumerate(small.host_lens):
        for j in range(-(-int(n) // 16)):
            to_top = s == 0 or (s == 2 and j % 2 == 0)
            new = top if to_top else bottom
            top, bottom = (top - 1, bottom) if to_top else (top, bottom + 1)
            old = int(small.host_tables[s, j])
            key_cache[new] = small.key_cache[old]
            value_cache[new] = small.value_cache[old]
            tables[s, j] = new
    small.key_cache, small.value_cache = key_cache, value_cache
    small.block_tables = torch.from_numpy(tables).to(key_cache.device)
    assert int(tables.max()) * 16 * 128 > 2**31, "the top blocks must lie past 2^31 elements"
    return small


def run_on_big_cache(version: str):
    """Runs ``KERNELS[version]`` on :func:`big_cache_case` (emulated) into a NaN-filled ``out=``.

    NOTE: a given helper (``reference.grader.proxy.given``): graded isolated, the 4 GiB cache
    cannot cross to the worker, so the worker builds it; the test compares the output.

    Returns:
        The output, a CPU tensor ``[3, 4, 128]``.
    """
    from reference.gpu import synchronize
    from reference.loader import load_impl

    case = big_cache_case(True)
    launch = load_impl("lab04_decode_kernels").KERNELS[version]
    got = launch(*case.args(), case.scale, out=case.poisoned_out())
    synchronize()
    return got.clone()
