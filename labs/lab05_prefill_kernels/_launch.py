"""Lab 5's given plumbing (not lab content): the kernels' tile shapes and supported sizes, the
batch and plan types, the checks that follow the plan, and the launch helpers.

Both ``starter.py`` and the solution import this file, so the two differ only in the TODOs; like
the tests, it is protected (grading reports an edit). The checks every kernel launcher of Labs 4
and 5 runs (``check_array``, ``check_scale``, ``check_on_cuda``, ``debug_enabled``) are in
``reference/checks.py``. The tensor-core kernel's CTA shape is an argument (:class:`TcTiling`,
``tc_tiling=``), never module state.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from reference.checks import check_int, check_on_cuda, debug_enabled
from reference.cuda import as_torch, emulating, ptr, to_host
from reference.layout import num_blocks_for

SUPPORTED_HEAD_SIZES = (64, 128)
#: Powers of two: the tensor-core kernel splits a position into (block, slot) with a shift.
SUPPORTED_BLOCK_SIZES = (8, 16, 32, 64, 128)
#: Which element types each kernel has code for.
KERNEL_DTYPES = {
    "naive": ("float32", "float16", "bfloat16"),
    "tiled": ("float32", "float16", "bfloat16"),
    "tc": ("float16", "bfloat16"),  # mma.sync m16n8k16 takes 16-bit operands
    "wgmma": ("float16", "bfloat16"),  # so does wgmma (Hopper only)
}
#: Tile shapes, which the plan and the kernels must agree on.
TILED_BLOCK_M, TILED_BLOCK_N, TILED_THREADS = 64, 64, 128
#: Tensor-core CTA by default: TC_WARPS warps of TC_ROWS_PER_WARP rows (see :class:`TcTiling`).
TC_WARPS, TC_ROWS_PER_WARP, TC_BLOCK_N = 4, 32, 64
#: Hopper (wgmma) CTA: one producer warpgroup (copies) and WGMMA_CONSUMERS consumer warpgroups
#: of 64 rows each; K and V tiles of WGMMA_BLOCK_N keys, WGMMA_STAGES of each in shared memory
#: (prefill_wgmma.cu instantiates exactly this shape).
WGMMA_CONSUMERS, WGMMA_BLOCK_N, WGMMA_STAGES = 2, 128, 2
WGMMA_BLOCK_M, WGMMA_THREADS = 64 * WGMMA_CONSUMERS, 128 * (WGMMA_CONSUMERS + 1)
#: Bytes of shared memory per Q buffer for the item it holds (the producer tells the consumers).
WGMMA_SLOT_BYTES = 64

DTYPE_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: The kernels load 16 bytes at a time: query, caches and out must start on such a boundary.
ALIGN = 16


@dataclass(frozen=True)
class TcTiling:
    """The tensor-core kernel's CTA: ``warps`` warps of ``rows_per_warp`` rows each (16 or 32:
    one or two m16 tiles). prefill_tc.cu compiles one kernel per shape it instantiates, named
    ``prefill_tc_<tag>_d<head_size>_w<warps>_r<rows_per_warp>``.

    Attributes:
        warps: warps per CTA.
        rows_per_warp: query rows (token, head pairs) per warp.
    """

    warps: int = TC_WARPS
    rows_per_warp: int = TC_ROWS_PER_WARP

    def __post_init__(self):
        check_int("tc_tiling.warps", self.warps, min_value=1)
        if self.rows_per_warp not in (16, 32):
            raise ValueError(f"tc_tiling.rows_per_warp must be 16 or 32 (one or two m16 tiles), "
                             f"got {self.rows_per_warp!r}")

    @property
    def block_m(self) -> int:
        """Rows per CTA: ``warps * rows_per_warp``."""
        return self.warps * self.rows_per_warp

    def kernel_name(self, dtype: str, head_size: int) -> str:
        """The ``extern "C"`` name of this shape's kernel for one dtype and head size."""
        return f"prefill_tc_{DTYPE_TAG[dtype]}_d{head_size}_w{self.warps}_r{self.rows_per_warp}"

    def shared_bytes(self, head_size: int) -> int:
        """Dynamic shared memory: the Q tile and two stages of K and V tiles, rows padded by 8
        elements (16 bytes) against bank conflicts."""
        return (self.block_m + 4 * TC_BLOCK_N) * (head_size + 8) * 2


#: The shape paged_prefill_tc uses unless told otherwise.
TC_TILING = TcTiling()


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


# ----------------------------------------------------------------------------- checks


def data_ptr(x) -> int:
    """The device (or host) address of a torch tensor or CuPy array (or the NumPy array that
    stands in for one under emulation)."""
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    return int(x.ctypes.data) if isinstance(x, np.ndarray) else int(x.data.ptr)


def host_ints(name: str, x) -> np.ndarray:
    """A host int64 copy of a small 1-D integer array (torch, CuPy, NumPy or a list)."""
    arr = to_host(x)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64)


def kernel_tiling(kernel: str, num_q_heads: int, num_kv_heads: int, *,
                  tc_tiling: TcTiling = TC_TILING) -> tuple[int, int, int]:
    """Returns the (rows_per_token, block_m, block_n) a kernel's plan must be made with.

    The naive kernel has no tiles; it takes any plan (it only uses the checked metadata).

    Args:
        kernel: ``"naive"``, ``"tiled"``, ``"tc"`` or ``"wgmma"``.
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        tc_tiling: the tensor-core kernel's CTA shape.

    Returns:
        ``(rows_per_token, block_m, block_n)``.

    Raises:
        ValueError: an unknown kernel, a head count below 1, or ``num_q_heads`` not a multiple
            of ``num_kv_heads``.
        TypeError: a head count that is not an int.
    """
    if kernel not in KERNEL_DTYPES:
        raise ValueError(f"kernel must be one of {sorted(KERNEL_DTYPES)}, got {kernel!r}")
    num_q_heads = check_int("num_q_heads", num_q_heads, min_value=1)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} must be a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    if kernel == "tiled":
        return 1, TILED_BLOCK_M, TILED_BLOCK_N
    if kernel == "tc":
        return num_q_heads // num_kv_heads, tc_tiling.block_m, TC_BLOCK_N
    if kernel == "wgmma":
        return num_q_heads // num_kv_heads, WGMMA_BLOCK_M, WGMMA_BLOCK_N
    return 1, TILED_BLOCK_M, TILED_BLOCK_N  # naive: any plan will do


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
    table = host_table(block_tables)
    for s, kv_len in enumerate(plan.context_lens.tolist()):
        used = table[s, : num_blocks_for(kv_len, block_size)]
        bad = np.flatnonzero((used < 0) | (used >= num_blocks))
        if bad.size:
            j = int(bad[0])
            raise IndexError(f"block_tables[{s}, {j}]={used[j]} is not a block id in "
                             f"[0, {num_blocks}) but sequence {s} (context_lens={kv_len}) reads it")


def host_table(x) -> np.ndarray:
    """A host NumPy copy of a torch tensor, CuPy array or NumPy array."""
    return to_host(x)


def check_launch(kernel: str, shapes: PrefillShapes, plan: TilePlan, *, query, key_cache,
                 value_cache, block_tables, cu_seqlens_q, context_lens, alibi_slopes, causal: bool,
                 out, debug: bool | None, tc_tiling: TcTiling = TC_TILING):
    """The checks that follow the plan, in order: the plan fits this batch and kernel, the block
    ids (debug or CPU inputs), the device (last); then the output as a torch tensor.

    Args:
        kernel: ``"naive"``, ``"tiled"``, ``"tc"`` or ``"wgmma"``.
        shapes: from ``check_prefill_inputs``.
        plan: the caller's or a fresh one.
        query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, alibi_slopes,
            causal, out, debug: the launcher's arguments.
        tc_tiling: the tensor-core kernel's CTA shape (its plan's block_m).

    Returns:
        ``out`` as a torch tensor, or a new one like ``query`` when ``out`` is None.

    Raises:
        ValueError: a plan of another batch or kernel, or a context the table cannot hold.
        IndexError: a block id the kernel would read is out of range.
        DeviceMismatchError: not every array on one CUDA device.
    """
    if kernel == "naive":  # no tiles: any plan of this batch will do
        check_plan_fits(plan, shapes, rows_per_token=None, block_m=None, block_n=None,
                        causal=causal)
    else:
        rows_per_token, block_m, block_n = kernel_tiling(kernel, shapes.num_q_heads,
                                                         shapes.num_kv_heads, tc_tiling=tc_tiling)
        check_plan_fits(plan, shapes, rows_per_token=rows_per_token, block_m=block_m,
                        block_n=block_n, causal=causal)
    if debug_enabled(debug) or _on_cpu(block_tables):
        check_block_ids(block_tables, plan, shapes.num_blocks, shapes.block_size)
    check_on_cuda(query=query, key_cache=key_cache, value_cache=value_cache,
                  block_tables=block_tables, cu_seqlens_q=cu_seqlens_q, context_lens=context_lens,
                  alibi_slopes=alibi_slopes, out=out)
    return as_torch(out) if out is not None else empty_like(as_torch(query))


def _on_cpu(x) -> bool:
    return hasattr(x, "device") and hasattr(x, "data_ptr") and x.device.type == "cpu"


# ----------------------------------------------------------------------------- launch


def empty_like(q):
    """A new uninitialised torch tensor like ``q`` (every element gets written)."""
    import torch

    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@contextlib.contextmanager
def device_of(q):
    """Makes the tensor's GPU current for torch (stream) and CuPy (module load, launch)."""
    if emulating():  # the emulated device has no "current GPU"
        yield
        return
    import cupy
    import torch

    with torch.cuda.device(q.device), cupy.cuda.Device(q.device.index):
        yield


def common_args(out, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                 alibi_slopes):
    """The pointer arguments every prefill kernel takes first, in its order (null: no ALiBi)."""
    return [ptr(out), ptr(query), ptr(key_cache), ptr(value_cache), ptr(block_tables),
            ptr(cu_seqlens_q), ptr(context_lens),
            np.uint64(0) if alibi_slopes is None else ptr(alibi_slopes)]


def scalars(scale, shapes: PrefillShapes, causal: bool):
    """The tiled and tensor-core kernels' scalar arguments, in their order."""
    return [np.float32(scale), np.int32(shapes.num_q_heads), np.int32(shapes.num_kv_heads),
            np.int32(shapes.block_size), np.int32(shapes.max_blocks_per_seq), np.int32(bool(causal))]


def wgmma_shared_bytes(head_size: int) -> int:
    """Dynamic shared memory of the Hopper kernel: two Q tiles (one per item in flight),
    WGMMA_STAGES stages of K tiles and of V tiles (16-bit, unpadded: the 128-byte swizzle keeps
    them conflict-free), 8-byte mbarriers after them (full and empty for each K and V stage and
    for each Q buffer), two 64-byte slots naming each Q buffer's item (WGMMA_SLOT_BYTES), and
    1 KiB so the kernel can start its tiles on a 1024-byte boundary (the swizzle pattern's
    period)."""
    tiles = (2 * WGMMA_BLOCK_M + 2 * WGMMA_STAGES * WGMMA_BLOCK_N) * head_size * 2
    return tiles + 8 * (4 * WGMMA_STAGES + 4) + 2 * WGMMA_SLOT_BYTES + 1024


def wgmma_counter(device):
    """The Hopper kernel's work counter: a zeroed int32 tensor [2] on ``device`` (how many items
    were taken after each CTA's first, how many CTAs are done). Allocate one per launch (a plan
    keeps the one its launch made): the last CTA of a launch zeroes it again, so the next
    launch finds it zero.

    Args:
        device: the torch device the kernel runs on.

    Returns:
        [2] int32 zeros (pass ``ptr(...)`` of it).
    """
    import torch

    return torch.zeros(2, dtype=torch.int32, device=device)


def tiled_shared_bytes(head_size: int, dtype: str) -> int:
    """Dynamic shared memory of the tiled kernel: Q, K, V tiles (padded rows), S/P, 2 vectors."""
    itemsize = _ITEMSIZE[dtype]
    stride = head_size + 4 // itemsize
    return (3 * 64 * stride * itemsize + TILED_BLOCK_M * (TILED_BLOCK_N + 1) * 4
            + 2 * TILED_BLOCK_M * 4)
