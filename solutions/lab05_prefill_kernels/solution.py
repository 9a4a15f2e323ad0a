"""Lab 5 — paged prefill on the GPU: a naive kernel, a tiled one, and one on tensor cores.

All three compute Lab 3's varlen prefill over the paged cache of ``reference/layout.py``:
queries of several sequences packed back to back (``cu_seqlens_q``), each sequence's new tokens
being the *last* ``q_len`` of its ``context_len`` (chunked prefill: the rest is history already
in the cache), causal masking with that history, GQA, optional ALiBi.

Every launcher has one shape (the CuPy gemm example's, and Lab 4's)::

    check_prefill_inputs        structure only: shapes, dtypes, contiguity, supported sizes
    plan_query_tiles            reads cu_seqlens_q / context_lens to the host, checks their
                                values, cuts every sequence into query tiles (the grid)
    check_plan_fits             the plan belongs to this batch; the block table holds the context
    check_block_ids             (debug, or CPU inputs) every block id the kernel will read exists
    check_on_cuda               last: every tensor on one CUDA device
    allocate out -> launch on the current torch stream -> return out

so every mistake in the input is reported before anything runs, and every check except the
last can be graded on a machine without a GPU.

Your tasks are marked ``TODO(lab5.k)``; ``LAB_IMPL=starter pagedlab grade 5`` lists the ones left.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.cuda import (as_torch, device_ok, emulating, get_kernel, is_cupy, launch,
                            like_input, ptr)
from reference.errors import DeviceMismatchError, UnsupportedConfigError
from reference.layout import num_blocks_for

#: The ``.cu`` files sit beside this loader (a mutant copy of the folder carries its own).
KERNEL_DIR = Path(__file__).resolve().parent

SUPPORTED_HEAD_SIZES = (64, 128)
#: Powers of two: the tensor-core kernel splits a position into (block, slot) with a shift.
SUPPORTED_BLOCK_SIZES = (8, 16, 32, 64, 128)
#: Which element types each kernel has code for.
KERNEL_DTYPES = {
    "naive": ("float32", "float16", "bfloat16"),
    "tiled": ("float32", "float16", "bfloat16"),
    "tc": ("float16", "bfloat16"),  # mma.sync m16n8k16 takes 16-bit operands
}
#: Tile shapes, which the plan and the kernels must agree on.
TILED_BLOCK_M, TILED_BLOCK_N, TILED_THREADS = 64, 64, 128
#: Tensor-core CTA: TC_WARPS warps of TC_ROWS_PER_WARP rows (16 or 32: one or two m16 tiles).
TC_WARPS, TC_ROWS_PER_WARP, TC_BLOCK_N = 4, 32, 64

#: ``PAGEDLAB_DEBUG=1`` turns on the checks that read device memory (block ids in range).
DEBUG_ENV = "PAGEDLAB_DEBUG"

_DTYPE_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
_ALIGN = 16  # the kernels load 16 bytes at a time


@dataclass(frozen=True)
class PrefillShapes:
    """Sizes of one prefill batch, read off the input shapes (no device memory is read).

    Attributes:
        num_tokens: packed query tokens (all sequences).
        num_q_heads: query heads.
        num_kv_heads: KV heads; ``num_q_heads`` is a multiple of it.
        head_size: elements per head vector.
        num_blocks: physical blocks in the cache.
        block_size: tokens per block.
        num_seqs: sequences in the batch.
        max_blocks_per_seq: block-table width.
        dtype: element type name (``"float16"``, ``"bfloat16"`` or ``"float32"``).
    """

    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    num_seqs: int
    max_blocks_per_seq: int
    dtype: str

    @property
    def group(self) -> int:
        """Query heads per KV head (1: multi-head, num_q_heads: multi-query)."""
        return self.num_q_heads // self.num_kv_heads


@dataclass
class TilePlan:
    """The grid of a tiled prefill kernel: which query tile each CTA computes, heaviest first.

    A *row* is one (query token, query head) pair of a sequence. With ``rows_per_token = g``
    (the tensor-core kernel stacks a GQA group's g query heads), sequence ``s`` has
    ``q_len[s] * g`` rows, row ``r`` being token ``r // g`` and head-in-group ``r % g``; it is
    cut into tiles of ``block_m`` rows. One CTA per (tile, head) then runs over the KV tiles of
    ``block_n`` keys its rows may see.

    Attributes:
        work: [num_work, 2] int32, (seq_idx, row_start) per tile, heaviest first.
        num_kv_tiles: [num_work] int32, KV tiles each tile visits (causal: up to its last row's
            diagonal; otherwise the whole context).
        cu_seqlens_q: [num_seqs + 1] int64, validated host copy.
        context_lens: [num_seqs] int64, validated host copy.
        rows_per_token: query rows per token (1, or the GQA group).
        block_m: rows per tile.
        block_n: keys per KV tile.
        causal: whether the plan skips tiles above the diagonal.
    """

    work: np.ndarray
    num_kv_tiles: np.ndarray
    cu_seqlens_q: np.ndarray
    context_lens: np.ndarray
    rows_per_token: int
    block_m: int
    block_n: int
    causal: bool
    _device_work: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        """Packed query tokens the plan covers (``cu_seqlens_q[-1]``)."""
        return int(self.cu_seqlens_q[-1])

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max(initial=0))

    def device_work(self, device):
        """Returns ``work`` as an int32 torch tensor on ``device`` (uploaded once, then cached)."""
        import torch

        key = str(device)
        if key not in self._device_work:
            self._device_work[key] = torch.from_numpy(np.ascontiguousarray(self.work)).to(device)
        return self._device_work[key]


# ----------------------------------------------------------------------------- validation


def _kind_ok(x) -> bool:
    return hasattr(x, "data_ptr") or is_cupy(x)


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def _is_contiguous(x) -> bool:
    if hasattr(x, "is_contiguous"):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def _data_ptr(x) -> int:
    return int(x.data_ptr()) if hasattr(x, "data_ptr") else int(x.data.ptr)


def _check_array(name: str, x, ndim: int, dtypes: tuple[str, ...]) -> None:
    """Type, rank, dtype and contiguity of one argument; errors name it."""
    if not _kind_ok(x):
        raise TypeError(f"{name} must be a torch tensor or a CuPy array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if _dtype_name(x) not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {_dtype_name(x)}")
    if not _is_contiguous(x):
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def check_prefill_inputs(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                         scale, *, kernel: str, alibi_slopes=None, out=None) -> PrefillShapes:
    """Checks the structure of a prefill call: everything knowable without reading values.

    Args:
        query: [num_tokens, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int32
        cu_seqlens_q: [num_seqs + 1] int32
        context_lens: [num_seqs] int32
        scale: softmax scale, a finite float > 0.
        kernel: ``"naive"``, ``"tiled"`` or ``"tc"`` (which dtypes are supported).
        alibi_slopes: [num_q_heads] float32, or None.
        out: [num_tokens, num_q_heads, head_size] like ``query``, or None.

    Returns:
        The batch's sizes.

    Raises:
        TypeError: an argument is not a torch tensor / CuPy array, has the wrong dtype, or
            ``scale`` is not a float.
        ValueError: wrong rank or shape, not contiguous, misaligned, or sizes that disagree
            (``num_q_heads`` not a multiple of ``num_kv_heads``, ``cu_seqlens_q`` not
            ``num_seqs + 1`` long, ...).
        UnsupportedConfigError: head_size, block_size or dtype the kernel has no code for.
    """
    if kernel not in KERNEL_DTYPES:
        raise ValueError(f"kernel must be one of {sorted(KERNEL_DTYPES)}, got {kernel!r}")
    floats = ("float32", "float16", "bfloat16")
    _check_array("query", query, 3, floats)
    dtype = _dtype_name(query)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_array(name, cache, 4, floats)
        if _dtype_name(cache) != dtype:
            raise TypeError(f"{name} has dtype {_dtype_name(cache)} but query has {dtype}")
    if tuple(value_cache.shape) != tuple(key_cache.shape):
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} differs from key_cache "
                         f"shape {tuple(key_cache.shape)}")
    _check_array("block_tables", block_tables, 2, ("int32",))
    _check_array("cu_seqlens_q", cu_seqlens_q, 1, ("int32",))
    _check_array("context_lens", context_lens, 1, ("int32",))

    num_tokens, num_q_heads, head_size = (int(n) for n in query.shape)
    num_blocks, num_kv_heads, block_size, cache_head_size = (int(n) for n in key_cache.shape)
    num_seqs, max_blocks_per_seq = (int(n) for n in block_tables.shape)
    if cache_head_size != head_size:
        raise ValueError(f"key_cache head_size {cache_head_size} differs from query head_size "
                         f"{head_size}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} (query) must be a multiple of "
                         f"num_kv_heads={num_kv_heads} (key_cache)")
    if num_blocks == 0 or max_blocks_per_seq == 0:
        raise ValueError(f"key_cache needs at least one block and block_tables at least one "
                         f"column, got {num_blocks} and {max_blocks_per_seq}")
    if tuple(context_lens.shape) != (num_seqs,):
        raise ValueError(f"context_lens must have shape ({num_seqs},) (one per block_tables row), "
                         f"got {tuple(context_lens.shape)}")
    if tuple(cu_seqlens_q.shape) != (num_seqs + 1,):
        raise ValueError(f"cu_seqlens_q must have shape ({num_seqs + 1},) (num_seqs + 1), got "
                         f"{tuple(cu_seqlens_q.shape)}")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise UnsupportedConfigError(f"head_size={head_size} is not supported (supported: "
                                     f"{SUPPORTED_HEAD_SIZES})")
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise UnsupportedConfigError(f"block_size={block_size} is not supported (supported: "
                                     f"{SUPPORTED_BLOCK_SIZES})")
    if dtype not in KERNEL_DTYPES[kernel]:
        raise UnsupportedConfigError(f"the {kernel} kernel does not support dtype {dtype} "
                                     f"(supported: {KERNEL_DTYPES[kernel]})")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    if not (math.isfinite(float(scale)) and float(scale) > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    if alibi_slopes is not None:
        _check_array("alibi_slopes", alibi_slopes, 1, ("float32",))
        if tuple(alibi_slopes.shape) != (num_q_heads,):
            raise ValueError(f"alibi_slopes must have shape ({num_q_heads},) (one per query "
                             f"head), got {tuple(alibi_slopes.shape)}")
    if out is not None:
        _check_array("out", out, 3, (dtype,))
        if tuple(out.shape) != tuple(query.shape):
            raise ValueError(f"out must have query's shape {tuple(query.shape)}, got "
                             f"{tuple(out.shape)}")
    for name, x in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("out", out)):
        if x is not None and _data_ptr(x) % _ALIGN:
            raise ValueError(f"{name} must start on a {_ALIGN}-byte boundary (the kernels load "
                             f"16 bytes at a time); it is a view with an odd offset")
    return PrefillShapes(num_tokens, num_q_heads, num_kv_heads, head_size, num_blocks, block_size,
                         num_seqs, max_blocks_per_seq, dtype)


def _host_ints(name: str, x) -> np.ndarray:
    """A host int64 copy of a small 1-D integer array (torch, CuPy, NumPy or a list)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif is_cupy(x):
        x = x.get()
    arr = np.asarray(x)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64)


def plan_query_tiles(cu_seqlens_q, context_lens, *, rows_per_token: int = 1, block_m: int = 64,
                     block_n: int = 64, causal: bool = True) -> TilePlan:
    """Cuts every sequence's query rows into tiles and lists them heaviest first.

    Reads ``cu_seqlens_q`` and ``context_lens`` to the host (a real engine has them there
    already: its scheduler made them) and checks their values on the way.

    Args:
        cu_seqlens_q: [num_seqs + 1] query offsets: starts at 0, never decreases.
        context_lens: [num_seqs] keys per sequence, history included: at least the sequence's
            query length.
        rows_per_token: rows per query token (the GQA group for the tensor-core kernel).
        block_m: rows per tile.
        block_n: keys per KV tile.
        causal: a tile visits keys up to its last row's diagonal only.

    Returns:
        The plan; empty sequences contribute no tile.

    Raises:
        ValueError: bad values, naming ``cu_seqlens_q`` or ``context_lens`` and the first bad
            sequence.
    """
    cu = _host_ints("cu_seqlens_q", cu_seqlens_q)
    ctx = _host_ints("context_lens", context_lens)
    if len(cu) != len(ctx) + 1:
        raise ValueError(f"cu_seqlens_q has {len(cu)} entries; context_lens has {len(ctx)} "
                         f"sequences, so it needs {len(ctx) + 1}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens_q[0] must be 0, got {cu[0]}")
    q_lens = np.diff(cu)
    if (q_lens < 0).any():
        s = int(np.argmax(q_lens < 0))
        raise ValueError(f"cu_seqlens_q must not decrease: cu_seqlens_q[{s}]={cu[s]} > "
                         f"cu_seqlens_q[{s + 1}]={cu[s + 1]}")
    if (ctx < q_lens).any():
        s = int(np.argmax(ctx < q_lens))
        raise ValueError(f"context_lens[{s}]={ctx[s]} is smaller than sequence {s}'s "
                         f"{q_lens[s]} query tokens: the history would be negative (the new "
                         f"tokens' K/V must be in the cache too)")
    work, kv_tiles = [], []
    for s, (q_len, kv_len) in enumerate(zip(q_lens.tolist(), ctx.tolist())):
        num_rows = q_len * rows_per_token
        history = kv_len - q_len
        for row_start in range(0, num_rows, block_m):
            last_token = (min(row_start + block_m, num_rows) - 1) // rows_per_token
            kv_end = history + last_token + 1 if causal else kv_len
            work.append((s, row_start))
            kv_tiles.append(-(-kv_end // block_n))
    kv_tiles_arr = np.asarray(kv_tiles, dtype=np.int32)
    # Heaviest first (stable, so ties keep sequence order): the long tiles start at once and the
    # short ones fill the gaps at the end, instead of one long tile running alone at the end.
    order = np.argsort(-kv_tiles_arr, kind="stable")
    work_arr = np.asarray(work, dtype=np.int32).reshape(-1, 2)[order]
    return TilePlan(work_arr, kv_tiles_arr[order], cu, ctx, rows_per_token, block_m, block_n,
                    bool(causal))


def kernel_tiling(kernel: str, num_q_heads: int, num_kv_heads: int) -> tuple[int, int, int]:
    """Returns the (rows_per_token, block_m, block_n) a kernel's plan must be made with.

    The naive kernel has no tiles; it takes any plan (it only uses the checked metadata).
    """
    if kernel == "tiled":
        return 1, TILED_BLOCK_M, TILED_BLOCK_N
    if kernel == "tc":
        return num_q_heads // num_kv_heads, tc_block_m(), TC_BLOCK_N
    if kernel == "naive":
        return 1, TILED_BLOCK_M, TILED_BLOCK_N
    raise ValueError(f"kernel must be one of {sorted(KERNEL_DTYPES)}, got {kernel!r}")


def plan_for_kernel(kernel: str, cu_seqlens_q, context_lens, *, num_q_heads: int,
                    num_kv_heads: int, causal: bool = True) -> TilePlan:
    """Plans a batch for one kernel, to pass as ``plan=`` to many calls (plan once, run many).

    A launcher given a plan reads nothing back from the GPU: the values were checked here.

    Args:
        kernel: ``"naive"``, ``"tiled"`` or ``"tc"``.
        cu_seqlens_q: [num_seqs + 1] query offsets.
        context_lens: [num_seqs] keys per sequence.
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        causal: the masking the calls will use.

    Returns:
        The plan.
    """
    rows_per_token, block_m, block_n = kernel_tiling(kernel, num_q_heads, num_kv_heads)
    return plan_query_tiles(cu_seqlens_q, context_lens, rows_per_token=rows_per_token,
                            block_m=block_m, block_n=block_n, causal=causal)


def check_plan_fits(plan: TilePlan, shapes: PrefillShapes, *, rows_per_token: int | None,
                    block_m: int | None, block_n: int | None, causal: bool) -> None:
    """Checks that a plan belongs to this batch and kernel, and that the table holds the context.

    Args:
        plan: from :func:`plan_query_tiles`.
        shapes: from :func:`check_prefill_inputs`.
        rows_per_token: what the kernel needs (None: any, for the naive kernel).
        block_m: rows per tile the kernel computes (None: any).
        block_n: keys per KV tile the kernel uses (None: any).
        causal: the call's masking.

    Raises:
        ValueError: naming ``cu_seqlens_q``, ``context_lens`` or ``plan``.
    """
    if plan.num_seqs != shapes.num_seqs:
        raise ValueError(f"plan has {plan.num_seqs} sequences, block_tables has {shapes.num_seqs}")
    if plan.num_tokens != shapes.num_tokens:
        raise ValueError(f"cu_seqlens_q[-1]={plan.num_tokens} but query has {shapes.num_tokens} "
                         f"tokens: cu_seqlens_q does not match query")
    capacity = shapes.max_blocks_per_seq * shapes.block_size
    if plan.max_context_len > capacity:
        s = int(np.argmax(plan.context_lens > capacity))
        raise ValueError(f"context_lens[{s}]={plan.context_lens[s]} needs "
                         f"{num_blocks_for(int(plan.context_lens[s]), shapes.block_size)} blocks "
                         f"but block_tables has {shapes.max_blocks_per_seq} columns: the history "
                         f"is longer than the cache holds")
    expected = {"rows_per_token": rows_per_token, "block_m": block_m, "block_n": block_n}
    for key, want in expected.items():
        if want is not None and getattr(plan, key) != want:
            raise ValueError(f"plan was made with {key}={getattr(plan, key)}, this kernel needs "
                             f"{want}")
    if plan.causal != bool(causal):
        raise ValueError(f"plan was made with causal={plan.causal}, the call has causal={causal}")


def check_block_ids(block_tables, plan: TilePlan, num_blocks: int, block_size: int) -> None:
    """Checks every block id the kernels will read: ``0 <= id < num_blocks``.

    Reads block_tables to the host, so launchers run it only when debugging (``debug=True`` or
    ``PAGEDLAB_DEBUG=1``) or when the inputs are on the CPU anyway.

    Raises:
        IndexError: naming the first bad ``block_tables[seq, j]``.
    """
    table = _host_table(block_tables)
    for s, kv_len in enumerate(plan.context_lens.tolist()):
        used = table[s, : num_blocks_for(kv_len, block_size)]
        bad = np.flatnonzero((used < 0) | (used >= num_blocks))
        if bad.size:
            j = int(bad[0])
            raise IndexError(f"block_tables[{s}, {j}]={used[j]} is not a block id in "
                             f"[0, {num_blocks}) but sequence {s} (context_lens={kv_len}) reads it")


def _host_table(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return x.get() if is_cupy(x) else np.asarray(x)


def check_on_cuda(**arrays) -> None:
    """Checks (last) that every given array is on the same CUDA device.

    Raises:
        DeviceMismatchError: naming the first array on the CPU or on another GPU.
    """
    device = None
    for name, x in arrays.items():
        if x is None:
            continue
        if hasattr(x, "device") and hasattr(x, "data_ptr"):
            here = (x.device.type, x.device.index)
        else:  # CuPy arrays always live on a GPU
            here = ("cuda", int(x.device.id))
        if here[0] != "cuda" and not (here[0] == "cpu" and device_ok(x.device)):
            raise DeviceMismatchError(f"{name} is on {here[0]}: the kernel needs CUDA tensors "
                                      f"(or CuPy arrays), all on one GPU")
        if device is None:
            device = (name, here)
        elif here != device[1]:
            raise DeviceMismatchError(f"{name} is on cuda:{here[1]} but {device[0]} is on "
                                      f"cuda:{device[1][1]}: all inputs must be on one GPU")


def _debug(debug: bool | None) -> bool:
    if debug is not None:
        return bool(debug)
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def _on_cpu(x) -> bool:
    return hasattr(x, "device") and hasattr(x, "data_ptr") and x.device.type == "cpu"


def _prepare(kernel, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
             scale, alibi_slopes, causal, out, plan, debug):
    """The validation sequence every launcher runs; returns (shapes, plan, out as torch)."""
    shapes = check_prefill_inputs(query, key_cache, value_cache, block_tables, cu_seqlens_q,
                                  context_lens, scale, kernel=kernel, alibi_slopes=alibi_slopes,
                                  out=out)
    if plan is None:
        plan = plan_for_kernel(kernel, cu_seqlens_q, context_lens, num_q_heads=shapes.num_q_heads,
                               num_kv_heads=shapes.num_kv_heads, causal=causal)
    if kernel == "naive":  # no tiles: any plan of this batch will do
        check_plan_fits(plan, shapes, rows_per_token=None, block_m=None, block_n=None,
                        causal=causal)
    else:
        rows_per_token, block_m, block_n = kernel_tiling(kernel, shapes.num_q_heads,
                                                         shapes.num_kv_heads)
        check_plan_fits(plan, shapes, rows_per_token=rows_per_token, block_m=block_m,
                        block_n=block_n, causal=causal)
    if _debug(debug) or _on_cpu(block_tables):
        check_block_ids(block_tables, plan, shapes.num_blocks, shapes.block_size)
    check_on_cuda(query=query, key_cache=key_cache, value_cache=value_cache,
                  block_tables=block_tables, cu_seqlens_q=cu_seqlens_q, context_lens=context_lens,
                  alibi_slopes=alibi_slopes, out=out)
    q = as_torch(query)
    out_t = as_torch(out) if out is not None else _empty_like(q)
    return shapes, plan, out_t


def _empty_like(q):
    import torch

    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@contextlib.contextmanager
def _device_of(q):
    """Makes the tensor's GPU current for torch (stream) and CuPy (module load, launch)."""
    if emulating():  # the emulated device has no "current GPU"
        yield
        return
    import cupy
    import torch

    with torch.cuda.device(q.device), cupy.cuda.Device(q.device.index):
        yield


def _common_args(out, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                 alibi_slopes):
    return [ptr(out), ptr(query), ptr(key_cache), ptr(value_cache), ptr(block_tables),
            ptr(cu_seqlens_q), ptr(context_lens),
            np.uint64(0) if alibi_slopes is None else ptr(alibi_slopes)]


def _scalars(scale, shapes: PrefillShapes, causal: bool):
    return [np.float32(scale), np.int32(shapes.num_q_heads), np.int32(shapes.num_kv_heads),
            np.int32(shapes.block_size), np.int32(shapes.max_blocks_per_seq), np.int32(bool(causal))]


# ----------------------------------------------------------------------------- launchers


def paged_prefill_naive(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                        scale, *, alibi_slopes=None, causal: bool = True, out=None,
                        plan: TilePlan | None = None, debug: bool | None = None):
    """Varlen paged prefill with the naive kernel: a CTA per (token, head), three passes.

    Args:
        query: [num_tokens, num_q_heads, head_size] (torch CUDA tensor or CuPy array)
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int32
        cu_seqlens_q: [num_seqs + 1] int32
        context_lens: [num_seqs] int32, history + new tokens
        scale: softmax scale.
        alibi_slopes: [num_q_heads] float32, or None.
        causal: mask keys after each query's position (with history).
        out: [num_tokens, num_q_heads, head_size] to write into, or None to allocate.
        plan: a :func:`plan_query_tiles` result for this batch (only its checked metadata is
            used here), or None to make one.
        debug: run the device-reading checks; None follows ``PAGEDLAB_DEBUG``.

    Returns:
        out, of the same kind (torch or CuPy) as ``query``.
    """
    shapes, plan, out_t = _prepare("naive", query, key_cache, value_cache, block_tables,
                                   cu_seqlens_q, context_lens, scale, alibi_slopes, causal, out,
                                   plan, debug)
    q = as_torch(query)
    if shapes.num_tokens:
        kernel = get_kernel(KERNEL_DIR / "prefill_naive.cu", f"prefill_naive_{_DTYPE_TAG[shapes.dtype]}")
        args = _common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [np.float32(scale), np.int32(shapes.num_seqs), np.int32(shapes.num_q_heads),
                 np.int32(shapes.num_kv_heads), np.int32(shapes.block_size),
                 np.int32(shapes.max_blocks_per_seq), np.int32(bool(causal))]
        with _device_of(q):
            launch(kernel, (shapes.num_tokens, shapes.num_q_heads), (shapes.head_size,), args,
                   shared_mem=4 * shapes.head_size)
    return like_input(out_t, query) if out is None else out


def tiled_shared_bytes(head_size: int, dtype: str) -> int:
    """Dynamic shared memory of the tiled kernel: Q, K, V tiles (padded rows), S/P, 2 vectors."""
    itemsize = _ITEMSIZE[dtype]
    stride = head_size + 4 // itemsize
    return (3 * 64 * stride * itemsize + TILED_BLOCK_M * (TILED_BLOCK_N + 1) * 4
            + 2 * TILED_BLOCK_M * 4)


def paged_prefill_tiled(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                        scale, *, alibi_slopes=None, causal: bool = True, out=None,
                        plan: TilePlan | None = None, debug: bool | None = None):
    """Varlen paged prefill with the tiled (FlashAttention-2 style, CUDA-core) kernel.

    A CTA per (64-token query tile, query head); the plan (``rows_per_token=1``,
    ``block_m=64``, ``block_n=64``) lists the tiles heaviest first. Arguments and return value
    as :func:`paged_prefill_naive`.
    """
    shapes, plan, out_t = _prepare("tiled", query, key_cache, value_cache, block_tables,
                                   cu_seqlens_q, context_lens, scale, alibi_slopes, causal, out,
                                   plan, debug)
    q = as_torch(query)
    num_work = len(plan.work)
    if num_work:
        name = f"prefill_tiled_{_DTYPE_TAG[shapes.dtype]}_d{shapes.head_size}"
        kernel = get_kernel(KERNEL_DIR / "prefill_tiled.cu", name)
        args = _common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [ptr(plan.device_work(q.device))] + _scalars(scale, shapes, causal)
        with _device_of(q):
            launch(kernel, (num_work * shapes.num_q_heads,), (TILED_THREADS,), args,
                   shared_mem=tiled_shared_bytes(shapes.head_size, shapes.dtype))
    return like_input(out_t, query) if out is None else out


def tc_block_m() -> int:
    """Rows per CTA of the tensor-core kernel: TC_WARPS * TC_ROWS_PER_WARP."""
    return TC_WARPS * TC_ROWS_PER_WARP


def tc_shared_bytes(head_size: int) -> int:
    """Dynamic shared memory of the tensor-core kernel: the Q tile and two stages of K and V
    tiles, rows padded by 8 elements (16 bytes) against bank conflicts."""
    return (tc_block_m() + 4 * TC_BLOCK_N) * (head_size + 8) * 2


def paged_prefill_tc(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                     scale, *, alibi_slopes=None, causal: bool = True, out=None,
                     plan: TilePlan | None = None, debug: bool | None = None):
    """Varlen paged prefill on tensor cores (mma.sync, fp16/bf16 in, fp32 accumulate).

    A CTA per (tile of ``TC_WARPS * TC_ROWS_PER_WARP`` rows, KV head), a row being a (token,
    query head) pair of the KV head's GQA group, so the group's heads share every K/V tile. The
    plan needs ``rows_per_token = num_q_heads // num_kv_heads``, ``block_m = tc_block_m()``,
    ``block_n = 64``. Arguments and return value as :func:`paged_prefill_naive`.
    """
    shapes, plan, out_t = _prepare("tc", query, key_cache, value_cache, block_tables,
                                   cu_seqlens_q, context_lens, scale, alibi_slopes, causal, out,
                                   plan, debug)
    q = as_torch(query)
    num_work = len(plan.work)
    if num_work:
        name = (f"prefill_tc_{_DTYPE_TAG[shapes.dtype]}_d{shapes.head_size}_w{TC_WARPS}"
                f"_r{TC_ROWS_PER_WARP}")
        kernel = get_kernel(KERNEL_DIR / "prefill_tc.cu", name)
        args = _common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [ptr(plan.device_work(q.device))] + _scalars(scale, shapes, causal)
        with _device_of(q):
            launch(kernel, (num_work * shapes.num_kv_heads,), (32 * TC_WARPS,), args,
                   shared_mem=tc_shared_bytes(shapes.head_size))
    return like_input(out_t, query) if out is None else out
