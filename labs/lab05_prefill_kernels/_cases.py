"""Test helpers for Lab 5: seeded prefill batches as torch tensors, the float64 oracle, and a
comparison whose failure message points at the first bad sequence, head and token.

Tolerance (relative error per (sequence, query head), ``‖out − ref‖ / ‖ref‖`` over the
sequence's tokens and the head's dims, against the float64 oracle run on the *same* rounded
inputs): float32 1e-4, float16 5e-3, bfloat16 1.5e-2. The kernels accumulate in fp32; what
remains is rounding P to 16 bits for the tensor-core PV product and rounding the output
(bf16 keeps 8 significant bits, ≈ 4e-3 relative). NaN never passes.

Under the emulated device (``PAGEDLAB_DEVICE=emulate``) :func:`make_batch` shrinks every query
and history length of two tiles or more with :func:`emulated_length`. It keeps what a kernel can
get wrong about a length: where it ends in the kernel's tile (64 rows; 32 for the naive kernel,
which has no tiles) and so in its 16- or 32-token block, and whether it spans several tiles.
Every case keeps its partial tiles, partial blocks, empty sequences, GQA groups, head sizes,
ALiBi and causal masking with history. On the GPU the lengths are used as written.
"""

from __future__ import annotations

import numpy as np

from reference.inputs import make_prefill_case
from reference.oracle import paged_prefill_ref

KERNELS = ("naive", "tiled", "tc")
TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 1.5e-2}
#: The period :func:`emulated_length` keeps, per kernel: the tiled and tensor-core kernels cut
#: queries and keys into 64-row tiles (a multiple of the 16- and 32-token blocks), the Hopper
#: kernel into 128-row tiles and 128-key tiles; the naive
#: kernel has no tiles, only blocks, and is the slowest to emulate (a CTA per query token, five
#: shuffles per score, three passes over the keys).
EMU_PERIOD = {"naive": 32, "tiled": 64, "tc": 64, "wgmma": 128}


def emulated_length(n: int, period: int) -> int:
    """A shorter stand-in for a query or history length, for the emulated device.

    The emulator runs every CUDA thread as a fiber, so Lab 5's kernels cost minutes at the GPU
    tests' lengths. What a kernel can get wrong about a length is where it ends in its tile and
    in its last block, and whether it spans several tiles (the online-softmax rescale); a
    stand-in keeps all three.

    Args:
        n: the length the test asks for (an int >= 0).
        period: the kernel's tile (a multiple of the block sizes 16 and 32).

    Returns:
        ``n`` when ``n < 2 * period``; otherwise a length in ``(period, 2 * period]`` with the
        same remainder modulo ``period`` (``2 * period`` for a multiple: two full tiles).
    """
    n = int(n)
    if n < 2 * period:
        return n
    return period + (n % period or period)


def sized(lengths, kernel: str | None) -> list[int]:
    """The lengths a kernel test uses here: as written on the GPU, shrunk when emulated.

    Args:
        lengths: query or history lengths (ints >= 0).
        kernel: ``"naive"``, ``"tiled"``, ``"tc"`` or ``"wgmma"`` (its tile sets the period kept); None keeps
            the lengths as written also under emulation.

    Returns:
        A list of ints (see :func:`emulated_length`).
    """
    from reference.emulate import emulating

    if kernel is None or not emulating():
        return [int(n) for n in lengths]
    return [emulated_length(n, EMU_PERIOD[kernel]) for n in lengths]


def launcher(impl, kernel: str):
    """Returns ``impl.paged_prefill_<kernel>``."""
    return getattr(impl, f"paged_prefill_{kernel}")


def make_batch(seed: int, query_lens, history_lens, num_q_heads: int, num_kv_heads: int,
               head_size: int, block_size: int, *, dtype: str = "float16", alibi: bool = False,
               device: str | None = None, kernel: str | None = None, **kv_kwargs) -> dict:
    """Builds a seeded batch (poisoned padding) as torch tensors on ``device``.

    Args:
        kernel: the kernel the batch is for: under emulation its lengths are shrunk by
            :func:`sized` (see the module docstring); None keeps them as written.

    Returns:
        Keyword arguments for a launcher: query, key_cache, value_cache, block_tables,
        cu_seqlens_q, context_lens, scale, alibi_slopes.
    """
    import torch

    from reference.gpu import kernel_device

    device = device or kernel_device()  # "cuda", or "cpu" on the emulated device
    query_lens, history_lens = sized(query_lens, kernel), sized(history_lens, kernel)
    np_dtype = np.float16 if dtype == "float16" else np.float32  # bf16 is rounded from fp32
    case = make_prefill_case(seed, query_lens, history_lens, num_q_heads, num_kv_heads,
                             head_size, block_size, dtype=np_dtype, alibi=alibi, **kv_kwargs)
    tdtype = getattr(torch, dtype)

    def f(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device).to(tdtype)

    def i32(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int32)).to(device)

    return {
        "query": f(case.query),
        "key_cache": f(case.kv.key_cache),
        "value_cache": f(case.kv.value_cache),
        "block_tables": i32(case.kv.block_tables),
        "cu_seqlens_q": i32(case.cu_seqlens_q),
        "context_lens": i32(case.kv.context_lens),
        "scale": case.scale,
        "alibi_slopes": None if case.alibi_slopes is None
        else torch.from_numpy(case.alibi_slopes).to(device),
    }


def _f64(x) -> np.ndarray:
    import torch

    x = torch.as_tensor(x) if not hasattr(x, "detach") else x
    return x.detach().to("cpu", torch.float64).numpy()


def oracle(batch: dict, *, causal: bool = True) -> np.ndarray:
    """The float64 reference output for a batch, from the same (rounded) values the kernel reads."""
    out, _ = paged_prefill_ref(
        _f64(batch["query"]), _f64(batch["key_cache"]), _f64(batch["value_cache"]),
        batch["block_tables"].cpu().numpy(), batch["cu_seqlens_q"].cpu().numpy(),
        batch["context_lens"].cpu().numpy(), batch["scale"], causal=causal,
        alibi_slopes=None if batch["alibi_slopes"] is None else batch["alibi_slopes"].cpu().numpy())
    return out


#: More likely causes of a wrong answer from the Hopper kernel (Task 5.6): its own machinery.
WGMMA_CAUSES = (" For the wgmma kernel, also: a descriptor's leading or stride byte offset or "
                "its swizzle mode (V's matter at head size 128, not 64), a k16 step's start "
                "address, an mbarrier phase's parity, a Q buffer or ring stage reused before its "
                "empty barrier, or a TMA box that does not match the tile.")


def check_close(out, ref: np.ndarray, batch: dict, *, dtype: str, what: str = "") -> None:
    """Asserts the kernel output matches the oracle; the message names the first bad spot.

    Args:
        out: the kernel's output (torch, CuPy or NumPy), [num_tokens, num_q_heads, head_size].
        ref: the oracle's, float64.
        batch: the batch (for sequence boundaries and history lengths).
        dtype: element type name, for the tolerance.
        what: a short description of the case for the message.
    """
    if type(out).__module__.startswith("cupy"):
        out = out.get()
    got = _f64(out) if hasattr(out, "detach") else np.asarray(out, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: output shape {got.shape}, expected {ref.shape}"
    cu = batch["cu_seqlens_q"].cpu().numpy()
    ctx = batch["context_lens"].cpu().numpy()
    bad = ~np.isfinite(got)
    if bad.any():
        t, h, d = np.argwhere(bad)[0]
        s = int(np.searchsorted(cu, t, side="right") - 1)
        hist = int(ctx[s] - (cu[s + 1] - cu[s]))
        raise AssertionError(
            f"{what}: {int(bad.sum())} non-finite outputs; first at packed token {t} (sequence "
            f"{s}, query {t - cu[s]} of {cu[s + 1] - cu[s]}, history {hist}), head {h}, dim {d}. "
            f"Likely cause: a key/value row past the context (the cache's padding is NaN) or a "
            f"block id read wrongly was used; shared memory read before it was written (a "
            f"missing __syncthreads() between a tile's use and the next load; emulated, fresh "
            f"shared memory is NaN); or this output was never written (outputs start NaN)."
            + (WGMMA_CAUSES if what.startswith("wgmma") else ""))
    tol = TOLERANCE[dtype]
    worst = (0.0, None)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        if a == b:
            continue
        for h in range(ref.shape[1]):
            r = ref[a:b, h]
            err = np.linalg.norm(got[a:b, h] - r) / max(np.linalg.norm(r), 1e-30)
            if err > worst[0]:
                worst = (err, (s, h, a, b))
    err, where = worst
    if err > tol:
        s, h, a, b = where
        row_err = np.abs(got[a:b, h] - ref[a:b, h]).max(axis=1)
        i = int(np.argmax(row_err > tol * np.abs(ref[a:b, h]).max()))
        hist = int(ctx[s] - (b - a))
        raise AssertionError(
            f"{what}: relative error {err:.3g} > {tol:g} ({dtype}) for sequence {s} (query_len "
            f"{b - a}, history {hist}), query head {h}; first bad query {i} (position "
            f"{hist + i}), max abs error there {row_err[i]:.3g}. Likely causes: the causal limit "
            f"(history + i), the GQA head mapping, ALiBi's sign, a tile edge, the online-"
            f"softmax rescale, or a missing __syncthreads() (a tile overwritten while still read)."
            + (WGMMA_CAUSES if what.startswith("wgmma") else ""))


def poison_allocator(nbytes: int) -> None:
    """Leaves a NaN-filled block of ``nbytes`` in torch's caching allocator, so the next
    allocation of that size starts as NaN (an output element the kernel skips stays NaN)."""
    import torch

    from reference.gpu import kernel_device

    junk = torch.full((max(nbytes, 2) // 2,), float("nan"), dtype=torch.float16,
                      device=kernel_device())
    del junk


def fill_array_out(kernel: str, batch: dict):
    """Calls ``paged_prefill_<kernel>`` on CuPy (emulated: NumPy) copies of ``batch`` with a
    NaN-filled array ``out=``.

    NOTE: tests call it through ``reference.grader.proxy.given``, so it runs where the student's
    code runs: grading isolated, a CuPy ``out=`` could not be shared with the worker.

    Returns:
        ``(whether the launcher returned out itself, out as a torch tensor)``.
    """
    import torch

    from reference.gpu import array_module, synchronize
    from reference.loader import load_impl

    xp = array_module()
    as_xp = {k: (xp.from_dlpack(v) if hasattr(v, "data_ptr") else v) for k, v in batch.items()}
    out = xp.full(tuple(as_xp["query"].shape), np.nan, dtype=as_xp["query"].dtype)
    got = launcher(load_impl("lab05_prefill_kernels"), kernel)(**as_xp, out=out)
    synchronize()
    return got is out, torch.from_dlpack(out).clone()
