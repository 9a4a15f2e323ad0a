"""Lab 4 — paged-attention decode on the GPU: from a naive kernel to one as fast as FlashInfer.

Every launcher computes the decode step of Lab 3 over the cache of ``reference/layout.py``: one
query token per sequence (the last one, so it sees every key), GQA (query head ``h`` reads KV
head ``h // group``), and the zero-length contract (``context_len == 0`` -> output exactly 0,
log-sum-exp -inf). The kernels are CUDA C++ in the ``.cu`` files beside this loader:

    decode_naive.cu   the baseline: per (token, head), every thread recomputes the dot product
    decode_v0.cu      4.0  the seed's kernel, its bugs fixed (the starter has the buggy one)
    decode_v1.cu      4.1  one pass, online softmax, warp shuffles; one CTA per query head
    decode_v2.cu      4.2  GQA-aware: one CTA per KV head loads each K/V row once
    decode_v3.cu      4.3  split-K (flash-decoding) + decode_reduce.cu to merge the partials
    decode_v4.cu      4.4  16-byte vectors, tiles of rows in flight, staged block ids
    decode_v5.cu      4.5  v4's walk with both products on tensor cores (mma.sync m16n8k16)
    decode_v6.cu      4.6  v5's math fed by a cp.async ring through shared memory (ldmatrix)

Every launcher has one shape (the CuPy gemm example's)::

    check_decode_args   structure, then (debug / CPU) the values, then the device: raises
                        before anything runs, and all but the last check work without a GPU
    allocate the output -> grid / block -> launch on the current torch stream -> return it

Your tasks are marked ``TODO(lab4.k)``; ``LAB_IMPL=starter pagedlab grade 4`` lists the ones left.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reference import cuda as rcuda
from reference.checks import check_int
from reference.errors import DeviceMismatchError, UnsupportedConfigError
from reference.layout import num_blocks_for

#: The ``.cu`` files sit beside this loader (a mutant copy of the folder carries its own).
KERNEL_DIR = Path(__file__).resolve().parent

SUPPORTED_HEAD_SIZES = (64, 128, 256)
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
SUPPORTED_DTYPES = ("float16", "bfloat16")
_CUDA_TYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16"}

#: ``PAGEDLAB_DEBUG=1`` (or ``debug=True``) turns on the checks that read device memory.
DEBUG_ENV = "PAGEDLAB_DEBUG"

#: Threads per CTA of v0..v4 (the naive kernel uses one thread per element instead).
NUM_THREADS = 128
#: v0 keeps one float score per token of the block table in shared memory.
V0_MAX_TOKENS = 32768
#: The GQA kernels hold at most this many query heads per CTA (registers).
MAX_HEADS_PER_CTA = 8
#: Overrides of v4's compile-time configuration for tuning sweeps (``pagedlab bench decode``):
#: keys ``NUM_WARPS``, ``VECS_PER_LANE`` (-D options of decode_v4.cu) and ``MAX_HEADS_PER_CTA``.
#: Empty: the defaults written in the kernel.
V4_TUNING: dict[str, int] = {}
#: Head sizes the tensor-core kernel (v5) has code for.
V5_HEAD_SIZES = (64, 128)
#: v6: head sizes it has code for, the most query heads a CTA serves (one m16 tile), the depth
#: of each warp's cp.async ring, and overrides for tuning sweeps (``NUM_WARPS``, ``NUM_STAGES``,
#: ``MAX_HEADS_PER_CTA``).
V6_HEAD_SIZES = (64, 128)
V6_MAX_HEADS_PER_CTA = 16
V6_NUM_STAGES = 3
V6_TUNING: dict[str, int] = {}
#: paged_attention picks v6 from this group size up (and v4 below it, or for head size 256).
V6_MIN_GROUP = 1
#: v6 stages a partition's block ids too, but its shared-memory table is sized for this many
#: tokens, so its partitions may be longer than v4's.
V6_MAX_PARTITION_SIZE = 4096
#: v6's plan aims at one CTA per SM: each CTA keeps NUM_WARPS * (NUM_STAGES - 1) tiles in flight,
#: and measured (H100, 2026-11-22) splitting further only added reduce traffic and tail effects:
#: on V, 2 x 2048 tokens ran at 86 % of the copy ceiling, 16 x 256 at 77 %.
V6_TARGET_CTAS_PER_SM = 1

#: Split-K plan: partitions are multiples of PARTITION_ALIGN tokens, at most MAX_PARTITION_SIZE
#: (v4 stages a partition's block ids in shared memory), and there are enough of them for
#: TARGET_CTAS_PER_SM CTAs per SM. A forced plan needs only a multiple of PARTITION_MULTIPLE.
PARTITION_ALIGN = 256
MAX_PARTITION_SIZE = 1024
PARTITION_MULTIPLE = 64
TARGET_CTAS_PER_SM = 4


@dataclass(frozen=True)
class DecodeShape:
    """Sizes of one decode batch, read off the input shapes (no device memory is read).

    Attributes:
        num_seqs: sequences (one query token each).
        num_q_heads: query heads.
        num_kv_heads: KV heads; ``num_q_heads`` is a multiple of it.
        head_size: elements per head vector.
        num_blocks: physical blocks in the cache.
        block_size: tokens per block.
        max_blocks_per_seq: block-table width.
        dtype: ``"float16"`` or ``"bfloat16"``.
        scale: the softmax scale actually used.
    """

    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int
    dtype: str
    scale: float

    @property
    def group(self) -> int:
        """Query heads per KV head (1: multi-head attention)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def table_tokens(self) -> int:
        """Tokens a block-table row can address: ``max_blocks_per_seq * block_size``."""
        return self.max_blocks_per_seq * self.block_size


@dataclass(frozen=True)
class SplitKVPlan:
    """How split-K cuts every context: partition ``p`` holds tokens
    ``[p * partition_size, (p + 1) * partition_size)``.

    Attributes:
        num_partitions: partitions of the longest context (the grid's z extent).
        partition_size: tokens per partition.
    """

    num_partitions: int
    partition_size: int


# ----------------------------------------------------------------------------- validation


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def _as_tensor(name: str, x):
    """A torch view of a torch tensor or CuPy array; TypeError naming ``name`` otherwise."""
    try:
        return rcuda.as_torch(x)
    except TypeError:
        raise TypeError(f"{name} must be a torch tensor or a CuPy array, got {type(x).__name__}") from None


def _check_tensor(name: str, x, ndim: int, dtypes: tuple[str, ...]) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if _dtype_name(x) not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {_dtype_name(x)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(x.stride())} "
                         "(call .contiguous() first: the kernels compute addresses from the shape)")


def debug_enabled(debug: bool | None = None) -> bool:
    """Whether the value checks that read device memory run (``debug`` wins over the env)."""
    if debug is not None:
        return bool(debug)
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def check_decode_args(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                      out=None, max_context_len: int | None = None, debug: bool | None = None,
                      check_device: bool = True):
    """Checks a decode call completely before anything is launched.

    Order: structure (types, ranks, dtypes, contiguity, shapes, supported sizes), then values
    (block ids in range, contexts the block table covers — only with ``debug`` or on CPU
    tensors, because reading device memory costs a synchronisation), then the device, last, so
    that every other mistake is reported on a machine without a GPU too.

    Args:
        query: [num_seqs, num_q_heads, head_size] float16 or bfloat16
        key_cache: [num_blocks, num_kv_heads, block_size, head_size], query's dtype
        value_cache: [num_blocks, num_kv_heads, block_size, head_size], query's dtype
        block_tables: [num_seqs, max_blocks_per_seq] int32
        context_lens: [num_seqs] int32
        scale: softmax scale, a finite float > 0; None means ``1 / sqrt(head_size)``.
        out: [num_seqs, num_q_heads, head_size] like ``query``, or None.
        max_context_len: a bound on every context length the caller promises, or None.
        debug: run the value checks on device tensors (None: ``PAGEDLAB_DEBUG``).
        check_device: end with :func:`check_on_cuda`; a launcher with checks of its own passes
            False and calls it after them, so the device is still checked last.

    Returns:
        ``(shape, tensors)``: a :class:`DecodeShape` and the six arguments as torch tensors
        (``out`` may be None).

    Raises:
        TypeError: not a tensor, or a wrong dtype.
        ValueError: a wrong rank, shape, contiguity or scale; a context the table cannot hold.
        UnsupportedConfigError: a head size or block size the kernels have no code for.
        IndexError: a block id outside ``[0, num_blocks)`` where the context needs one.
        DeviceMismatchError: not every tensor is on one CUDA device.
    """
    # TODO(lab4.0): the launcher contract. In this order:
    #  1. structure: every argument a tensor (_as_tensor), ranks / dtypes / contiguity
    #     (_check_tensor), shapes that agree, supported head and block sizes
    #     (UnsupportedConfigError), an ``out`` like query, q / caches / out starting on a
    #     16-byte boundary (the kernels load 16 bytes at a time), a finite scale > 0 (default
    #     1/sqrt(head_size)), max_context_len an int >= 0;
    #  2. values, only for CPU tensors or when debug_enabled(debug): _check_values(...);
    #  3. the device, last and only if check_device: check_on_cuda(...).
    # Return (DecodeShape(...), (q, k, v, bt, cl, o)).
    raise NotImplementedError("TODO(lab4.0): check_decode_args — validate everything before launch")


def check_on_cuda(**tensors) -> None:
    """The last check: every tensor (None skipped) on the first one's CUDA device.

    Raises:
        DeviceMismatchError: naming the first tensor on another device, or saying that the
            tensors are not on a CUDA device at all.
    """
    named = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.device != first.device:
            raise DeviceMismatchError(f"{name} is on {t.device} but {first_name} is on "
                                      f"{first.device}: every tensor must be on one CUDA device")
    if not rcuda.device_ok(first.device):  # CUDA, or the CPU under PAGEDLAB_DEVICE=emulate
        raise DeviceMismatchError(f"{first_name} is on {first.device}: the decode kernels need "
                                  "CUDA tensors (every check before this one passed)")


def _check_values(shape: DecodeShape, bt, cl, max_context_len: int | None) -> None:
    """The checks that read the block table and context lengths (a host copy)."""
    # TODO(lab4.0): read context_lens and block_tables to the host; context_lens in
    # [0, min(table_tokens, max_context_len)] (ValueError naming context_lens[s]); every block id
    # a sequence needs (its first ceil(len / block_size) slots) in [0, num_blocks) (IndexError
    # naming block_tables[s, j]). Padding past those slots is never read: ignore it.
    raise NotImplementedError("TODO(lab4.0): _check_values — block ids and context lengths")


# ----------------------------------------------------------------------------- plumbing


@functools.lru_cache(maxsize=None)
def _kernel(file: str, name: str, options: tuple[str, ...]):
    return rcuda.get_kernel(KERNEL_DIR / file, name, options=options)


def _options(shape: DecodeShape, **defines) -> tuple[str, ...]:
    """The -D options of one kernel configuration (one compiled module each)."""
    opts = [f"-DSCALAR_T={_CUDA_TYPE[shape.dtype]}", f"-DHEAD_SIZE={shape.head_size}",
            f"-DBLOCK_SIZE={shape.block_size}"]
    return tuple(opts + [f"-D{k}={v}" for k, v in sorted(defines.items())])


@functools.lru_cache(maxsize=None)
def _num_sms(device) -> int:
    return rcuda.num_sms(device)


def heads_per_cta(group: int, limit: int = MAX_HEADS_PER_CTA) -> int:
    """The largest divisor of ``group`` that is <= ``limit``: query heads one GQA CTA serves
    (they share its K/V loads).

    Args:
        group: query heads per KV head.
        limit: the most heads a CTA may hold (registers grow with it).

    Returns:
        The number of query heads per CTA.
    """
    # TODO(lab4.2): the largest divisor of group that is <= limit.
    raise NotImplementedError("TODO(lab4.2): heads_per_cta — how many query heads share a CTA")


def _new_out(shape: DecodeShape, q, out):
    import torch

    return out if out is not None else torch.empty_like(q)


def _finish(result, query):
    return rcuda.like_input(result, query)


def _scalars(shape: DecodeShape):
    return np.int32(shape.max_blocks_per_seq), np.int32(shape.num_kv_heads)


# ----------------------------------------------------------------------------- naive and v0


def paged_attention_naive(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                          out=None, debug=None):
    """The baseline: the seed's per-(token, head) kernel (decode_naive.cu).

    Args:
        query: [num_seqs, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int32
        context_lens: [num_seqs] int32
        scale: softmax scale (default ``1 / sqrt(head_size)``).
        out: optional output buffer like ``query``.
        debug: run the device-value checks (see :func:`check_decode_args`).

    Returns:
        [num_seqs, num_q_heads, head_size], the caller's kind (torch or CuPy).
    """
    shape, (q, k, v, bt, cl, out) = check_decode_args(query, key_cache, value_cache, block_tables,
                                                      context_lens, scale, out=out, debug=debug)
    out = _new_out(shape, q, out)
    if shape.num_seqs:
        kernel = _kernel("decode_naive.cu", "paged_decode_naive", _options(shape))
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads), (shape.head_size,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *_scalars(shape), np.float32(shape.scale)))
    return _finish(out, query)


def paged_attention_v0(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.0: the seed's two-pass kernel, its bugs fixed (decode_v0.cu).

    Args and Returns: as :func:`paged_attention_naive`.

    Raises:
        ValueError: the block table addresses more than V0_MAX_TOKENS tokens (v0 keeps one
            score per token in shared memory), besides everything :func:`check_decode_args`
            raises.
    """
    # TODO(lab4.0): decode_v0.cu has five bugs. Fix them, then delete the next line.
    raise NotImplementedError("TODO(lab4.0): fix the five bugs of decode_v0.cu, then delete this line")
    shape, (q, k, v, bt, cl, out) = check_decode_args(query, key_cache, value_cache, block_tables,
                                                      context_lens, scale, out=out, debug=debug,
                                                      check_device=False)
    if shape.table_tokens > V0_MAX_TOKENS:
        raise ValueError(f"block_tables addresses {shape.table_tokens} tokens per sequence; v0 "
                         f"keeps one score per token in shared memory and allows {V0_MAX_TOKENS}")
    check_on_cuda(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl, out=out)
    out = _new_out(shape, q, out)
    if shape.num_seqs:
        kernel = _kernel("decode_v0.cu", "paged_decode_v0", _options(shape))
        smem = 4 * (shape.head_size + NUM_THREADS // 32 + shape.table_tokens)
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads), (NUM_THREADS,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *_scalars(shape), np.float32(shape.scale)), shared_mem=smem)
    return _finish(out, query)


# ----------------------------------------------------------------------------- v1, v2


def paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.1: one pass with the online softmax, one CTA per (sequence, query head).

    Args and Returns: as :func:`paged_attention_naive`.
    """
    # TODO(lab4.1): validate, allocate the output (or use out), launch paged_decode_v1 of
    # decode_v1.cu on grid (num_seqs, num_q_heads) with NUM_THREADS threads, return the output.
    raise NotImplementedError("TODO(lab4.1): paged_attention_v1 — the one-pass online-softmax kernel")


def paged_attention_v2(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.2: GQA-aware, one CTA per (sequence, group of query heads of one KV head).

    Args and Returns: as :func:`paged_attention_naive`.
    """
    # TODO(lab4.2): like v1, with grid (num_seqs, num_q_heads // heads_per_cta(group)), the
    # kernel compiled with -DHEADS_PER_CTA, and the group size passed to the kernel.
    raise NotImplementedError("TODO(lab4.2): paged_attention_v2 — one CTA per KV head's query group")


# ----------------------------------------------------------------------------- split-K


def plan_split_kv(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int, *,
                  block_size: int = 16, target_ctas_per_sm: int = TARGET_CTAS_PER_SM,
                  max_partition_size: int = MAX_PARTITION_SIZE) -> SplitKVPlan:
    """Chooses how many partitions split-K cuts each context into, and how long they are.

    Without splitting the grid has ``num_seqs * num_kv_heads`` CTAs (one per sequence and KV
    head). When that cannot give every SM TARGET_CTAS_PER_SM of them — a few long sequences —
    the contexts are cut so that it can. Partitions are multiples of PARTITION_ALIGN tokens (a
    whole number of blocks and kernel tiles) and never longer than MAX_PARTITION_SIZE, which
    also keeps one CTA's work short, so a long sequence arriving last cannot leave the GPU
    waiting on one straggler.

    Args:
        num_seqs: sequences in the batch.
        num_kv_heads: KV heads.
        max_context_len: the longest context (tokens).
        num_sms: streaming multiprocessors of the device.
        block_size: tokens per KV block (8, 16 or 32).
        target_ctas_per_sm: CTAs per SM the plan aims for (v6, whose CTAs each keep a deep
            pipeline of loads in flight, wants 1).
        max_partition_size: the longest partition the kernel can stage (a multiple of
            PARTITION_ALIGN).

    Returns:
        The plan; ``num_partitions == 1`` means no split (and no reduce kernel).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range.
    """
    # TODO(lab4.3): validate the arguments (check_int), then: partitions that would give
    # target_ctas_per_sm * num_sms CTAs; their length aligned to PARTITION_ALIGN (up, unless that
    # loses a partition), clamped to [PARTITION_ALIGN, max_partition_size]; enough of them to
    # cover max_context_len (at least 1).
    raise NotImplementedError("TODO(lab4.3): plan_split_kv — how split-K cuts the contexts")


def _check_plan(shape: DecodeShape, plan, max_context_len, max_size: int | None) -> None:
    """A caller's forced plan must cover the contexts in whole tiles (checked before launch)."""
    if plan is None:
        return
    max_len = shape.table_tokens if max_context_len is None else int(max_context_len)
    if not isinstance(plan, SplitKVPlan):
        raise TypeError(f"plan must be a SplitKVPlan, got {type(plan).__name__}")
    n, size = check_int("plan.num_partitions", plan.num_partitions, min_value=1), plan.partition_size
    check_int("plan.partition_size", size, min_value=PARTITION_MULTIPLE)
    if size % PARTITION_MULTIPLE or (max_size is not None and size > max_size):
        raise ValueError(f"plan.partition_size={size} must be a multiple of {PARTITION_MULTIPLE}"
                         + (f" and <= {max_size}" if max_size else ""))
    if n * size < max_len:
        raise ValueError(f"plan covers {n} x {size} tokens < max_context_len={max_len}")


def _split_kv_launch(file: str, name: str, query, key_cache, value_cache, block_tables,
                     context_lens, scale, out, debug, max_context_len, plan, return_lse,
                     max_partition: int | None, tuning: dict | None = None,
                     head_sizes: tuple[int, ...] = SUPPORTED_HEAD_SIZES, shared_mem=None,
                     target_ctas_per_sm: int = TARGET_CTAS_PER_SM):
    """v3..v6 differ only in their kernel: validate, plan, launch, reduce when split.

    ``max_partition`` (None: v3, no cap of its own) is the longest partition the kernel stages:
    it caps the plan and reaches the kernel as -DMAX_PARTITION_SIZE. ``shared_mem(shape,
    defines)`` gives a kernel's dynamic shared memory in bytes (v6's ring);
    ``target_ctas_per_sm`` goes to :func:`plan_split_kv`.
    """
    # TODO(lab4.3): check_decode_args(..., check_device=False), _check_plan, check_on_cuda, then
    # the plan (plan_split_kv with the device's SM count, target_ctas_per_sm and max_partition as
    # its max_partition_size — MAX_PARTITION_SIZE when None — unless one was forced),
    # the output, an lse buffer, the partial buffers when num_partitions > 1; launch the kernel
    # on grid (num_seqs, num_q_heads // heads_per_cta(group), num_partitions) with shared_mem's
    # bytes of dynamic shared memory (when given), then the reduce kernel when the context was
    # split. Defines: HEADS_PER_CTA, MAX_PARTITION_SIZE (= max_partition, when given) plus the
    # tuning dict (its MAX_HEADS_PER_CTA caps heads_per_cta; its NUM_WARPS sets the threads).
    raise NotImplementedError("TODO(lab4.3): _split_kv_launch — split-K plan, kernel and merge")


def paged_attention_v3(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """Task 4.3: split-K (flash-decoding): v2 per partition, then decode_reduce.cu.

    Args:
        query, key_cache, value_cache, block_tables, context_lens, scale, out, debug: as
            :func:`paged_attention_naive`.
        max_context_len: the longest context (default: what the block table can address);
            sizes the plan.
        plan: a :class:`SplitKVPlan` to use instead of :func:`plan_split_kv`'s.
        return_lse: also return the log-sum-exp, [num_seqs, num_q_heads] float32 (natural log;
            -inf for an empty sequence).

    Returns:
        The output, or ``(output, lse)`` with ``return_lse``.
    """
    return _split_kv_launch("decode_v3.cu", "paged_decode_v3", query, key_cache, value_cache,
                            block_tables, context_lens, scale, out, debug, max_context_len, plan,
                            return_lse, None)


def paged_attention_v4(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """Task 4.4: the fast kernel — v3's split-K with 16-byte loads and tiles in flight.

    Args and Returns: as :func:`paged_attention_v3`; a forced ``plan`` must keep
    ``partition_size <= MAX_PARTITION_SIZE`` (the kernel stages a partition's block ids).
    """
    # TODO(lab4.4): write the kernel of decode_v4.cu, then delete the next line (the launcher is
    # v3's: only the kernel and the partition cap differ).
    raise NotImplementedError("TODO(lab4.4): paged_attention_v4 — write decode_v4.cu's kernel")
    return _split_kv_launch("decode_v4.cu", "paged_decode_v4", query, key_cache, value_cache,
                            block_tables, context_lens, scale, out, debug, max_context_len, plan,
                            return_lse, MAX_PARTITION_SIZE, V4_TUNING)


def paged_attention_v5(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """Task 4.5: v4 with both matrix products on tensor cores (mma.sync m16n8k16, fp32 accumulate).

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    # TODO(lab4.5): write the kernel of decode_v5.cu, then delete the next line.
    raise NotImplementedError("TODO(lab4.5): paged_attention_v5 — write decode_v5.cu's kernel")
    return _split_kv_launch("decode_v5.cu", "paged_decode_v5", query, key_cache, value_cache,
                            block_tables, context_lens, scale, out, debug, max_context_len, plan,
                            return_lse, MAX_PARTITION_SIZE, None, V5_HEAD_SIZES)


def _v6_ring_bytes(shape: DecodeShape, defines: dict) -> int:
    """v6's dynamic shared memory: per warp, NUM_STAGES slots of a 16-token K tile and V tile."""
    num_warps = defines.get("NUM_WARPS", NUM_THREADS // 32)
    return num_warps * defines["NUM_STAGES"] * 2 * 16 * shape.head_size * 2


def paged_attention_v6(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """Task 4.6: v5's tensor-core math fed by a cp.async pipeline through shared memory.

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    # TODO(lab4.6): write the kernel of decode_v6.cu, then delete the next line.
    raise NotImplementedError("TODO(lab4.6): paged_attention_v6 — write decode_v6.cu's kernel")
    tuning = {"MAX_HEADS_PER_CTA": V6_MAX_HEADS_PER_CTA, "NUM_STAGES": V6_NUM_STAGES, **V6_TUNING}
    return _split_kv_launch("decode_v6.cu", "paged_decode_v6", query, key_cache, value_cache,
                            block_tables, context_lens, scale, out, debug, max_context_len, plan,
                            return_lse, V6_MAX_PARTITION_SIZE, tuning, V6_HEAD_SIZES,
                            _v6_ring_bytes, V6_TARGET_CTAS_PER_SM)


def _prefers_v6(query, key_cache) -> bool:
    """A head size v6 has code for and a group of at least V6_MIN_GROUP (shapes only: the
    launcher validates)."""
    # TODO(lab4.6): True when query / key_cache have 3 / 4 dimensions, the head size is one of
    # V6_HEAD_SIZES and the group (num_q_heads // num_kv_heads) is at least V6_MIN_GROUP. Measure
    # v4 and v6 on your GPU (pagedlab bench decode) and move V6_MIN_GROUP if they disagree.
    raise NotImplementedError("TODO(lab4.6): _prefers_v6 — when paged_attention uses v6")


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                    max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """The production entry point: v6 (pipelined tensor cores) where it has code, else v4.

    v4's CUDA-core multiply-adds grow with the GQA group and cap it below the copy ceiling from
    a group of 4 on fast HBM; v6's tensor cores do not care, and its cp.async ring keeps enough
    bytes in flight to match v4 even on MHA. Head size 256 goes to v4.

    Args and Returns: as :func:`paged_attention_v4`.
    """
    fn = paged_attention_v6 if _prefers_v6(query, key_cache) else paged_attention_v4
    return fn(query, key_cache, value_cache, block_tables, context_lens, scale,
              max_context_len=max_context_len, plan=plan, return_lse=return_lse, out=out,
              debug=debug)


#: Every kernel version, in the order of the journey (benchmarks and tests iterate over it).
KERNELS = {
    "naive": paged_attention_naive,
    "v0": paged_attention_v0,
    "v1": paged_attention_v1,
    "v2": paged_attention_v2,
    "v3": paged_attention_v3,
    "v4": paged_attention_v4,
    "v5": paged_attention_v5,
    "v6": paged_attention_v6,
}
