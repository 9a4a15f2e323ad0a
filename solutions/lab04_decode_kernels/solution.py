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

The plumbing is given, in protected files this module imports: ``_checks.py`` (the batch's
``DecodeShape``, ``as_tensor``), ``_launch.py`` (the kernels' limits, ``SplitKVPlan``, the
split-K kernel descriptions ``V3_KERNEL`` .. ``V6_KERNEL``, compile / launch helpers, the naive
and v0 launchers) and ``reference/checks.py`` (the array, scale and device checks Lab 5 shares).
``decode_naive.cu`` and ``decode_common.cuh`` are given too. Tuning (``tuning=`` of v3..v6) is an
argument, never module state.

Your tasks are marked ``TODO(lab4.k)``; ``LAB_IMPL=starter pagedlab grade 4`` lists the ones left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from labs.lab04_decode_kernels._checks import (  # noqa: F401  (re-exported: tests use them)
    SUPPORTED_BLOCK_SIZES,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_SIZES,
    DecodeShape,
    as_tensor,
)
from labs.lab04_decode_kernels._launch import (  # noqa: F401  (re-exported: tests, benchmark)
    MAX_HEADS_PER_CTA,
    MAX_PARTITION_SIZE,
    NUM_THREADS,
    PARTITION_ALIGN,
    PARTITION_MULTIPLE,
    TARGET_CTAS_PER_SM,
    V0_MAX_TOKENS,
    V3_KERNEL,
    V4_KERNEL,
    V5_KERNEL,
    V6_HEAD_SIZES,
    V6_KERNEL,
    V6_MAX_PARTITION_SIZE,
    V6_TARGET_CTAS_PER_SM,
    SplitKVKernel,
    SplitKVPlan,
    check_plan,
    finish,
    get_kernel,
    kernel_options,
    launch_naive,
    launch_v0,
    new_out,
    num_sms,
    table_args,
)
from labs.lab04_decode_kernels._plan import DecodePlan  # noqa: F401  (re-exported)
from labs.lab04_decode_kernels._plan import plan_decode as _plan_decode
from reference import cuda as rcuda
from reference.checks import (  # noqa: F401
    check_array,
    check_int,
    check_on_cuda,
    check_scale,
    debug_enabled,
    dtype_name,
)
from reference.errors import UnsupportedConfigError
from reference.layout import num_blocks_for

#: The ``.cu`` files you write sit beside this loader (a mutant copy of the folder carries its
#: own); the given decode_naive.cu and decode_common.cuh are in labs/lab04_decode_kernels/.
KERNEL_DIR = Path(__file__).resolve().parent

#: paged_attention picks v6 from this group size up (and v4 below it, or for head size 256).
#: NOTE: measured, not derived (H200, 2026-11-29, graph replays, v6's ring 128-byte aligned):
#: from a group of 2 v6 wins (2: 69 against 83 µs on 16 x 4096; 4: 67 against 90 µs); on MHA
#: neither wins everywhere (32 x 2048: v6 250-253, v4 252-256 µs; 128 x 1024: v6 540, v4 510),
#: and v4 keeps it.
V6_MIN_GROUP = 2


# ----------------------------------------------------------------------------- validation


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
        check_device: end with ``check_on_cuda``; a launcher with checks of its own passes
            False and calls it after them, so the device is still checked last.

    Returns:
        ``(shape, tensors)``: a :class:`DecodeShape` and the six arguments as torch tensors
        (``out`` may be None).

    Raises:
        TypeError: not a tensor, or a wrong dtype (``query``, the caches, the metadata).
        ValueError: a wrong rank, shape, contiguity or scale; dimensions that disagree, the
            message naming the dimension (``num_kv_heads``, ``head_size``, ...); an ``out``
            unlike ``query`` in any way, its dtype included; a context the table cannot hold.
        UnsupportedConfigError: a head size or block size the kernels have no code for.
        IndexError: a block id outside ``[0, num_blocks)`` where the context needs one.
        DeviceMismatchError: not every tensor is on one CUDA device.
    """
    q = as_tensor("query", query)
    k = as_tensor("key_cache", key_cache)
    v = as_tensor("value_cache", value_cache)
    bt = as_tensor("block_tables", block_tables)
    cl = as_tensor("context_lens", context_lens)
    o = None if out is None else as_tensor("out", out)

    check_array("query", q, 3, SUPPORTED_DTYPES)
    dtype = dtype_name(q)
    check_array("key_cache", k, 4, (dtype,))
    check_array("value_cache", v, 4, (dtype,))
    check_array("block_tables", bt, 2, ("int32",))
    check_array("context_lens", cl, 1, ("int32",))
    num_seqs, num_q_heads, head_size = q.shape
    num_blocks, num_kv_heads, block_size, k_head_size = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"value_cache has shape {tuple(v.shape)}, key_cache {tuple(k.shape)}: "
                         "they must match")
    if k_head_size != head_size:
        raise ValueError(f"key_cache has head_size {k_head_size}, query {head_size}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"query's num_q_heads={num_q_heads} must be a multiple of key_cache's "
                         f"num_kv_heads={num_kv_heads}")
    if num_blocks == 0:
        raise ValueError("key_cache must hold at least one block")
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise UnsupportedConfigError(f"head_size={head_size} is not supported; the kernels have "
                                     f"code for {SUPPORTED_HEAD_SIZES}")
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise UnsupportedConfigError(f"block_size={block_size} is not supported; the kernels "
                                     f"have code for {SUPPORTED_BLOCK_SIZES}")
    if bt.shape[0] != num_seqs or bt.shape[1] == 0:
        raise ValueError(f"block_tables must have shape [num_seqs={num_seqs}, max_blocks_per_seq>=1],"
                         f" got {tuple(bt.shape)}")
    if tuple(cl.shape) != (num_seqs,):
        raise ValueError(f"context_lens must have shape [{num_seqs}], got {tuple(cl.shape)}")
    if o is not None:
        if tuple(o.shape) != tuple(q.shape) or dtype_name(o) != dtype or not o.is_contiguous():
            raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(q.shape)}, "
                             f"got {dtype_name(o)} {tuple(o.shape)}")
    for name, t in (("query", q), ("key_cache", k), ("value_cache", v), ("out", o)):
        if t is not None and t.data_ptr() % 16:
            raise ValueError(f"{name} must start on a 16-byte boundary (the kernels load 16 bytes "
                             f"at a time), but its address is {t.data_ptr() % 16} bytes past one")
    # NOTE: the kernels take the scale as float32: 1e39 would arrive as inf, 1e-50 as 0.
    scale = check_scale(1.0 / math.sqrt(head_size) if scale is None else scale, dtype=np.float32)
    shape = DecodeShape(num_seqs, num_q_heads, num_kv_heads, head_size, num_blocks, block_size,
                        bt.shape[1], dtype, scale)
    if max_context_len is not None:
        # NOTE: rebind: a NumPy or 0-d torch integer becomes the Python int _check_values needs.
        max_context_len = check_int("max_context_len", max_context_len, min_value=0)

    on_cpu = any(t.device.type == "cpu" for t in (q, k, v, bt, cl))
    if on_cpu or debug_enabled(debug):
        _check_values(shape, bt, cl, max_context_len)

    if check_device:
        check_on_cuda(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl, out=o)
    return shape, (q, k, v, bt, cl, o)


def _check_values(shape: DecodeShape, bt, cl, max_context_len: int | None) -> None:
    """The checks that read the block table and context lengths (a host copy)."""
    lens = cl.cpu().numpy().astype(np.int64)
    table = bt.cpu().numpy()
    if (lens < 0).any():
        s = int(np.argmax(lens < 0))
        raise ValueError(f"context_lens[{s}]={lens[s]} is negative")
    limit = shape.table_tokens if max_context_len is None else min(shape.table_tokens,
                                                                  max_context_len)
    if (lens > limit).any():
        s = int(np.argmax(lens > limit))
        what = (f"the block table covers ({limit} tokens = {shape.max_blocks_per_seq} blocks "
                f"of {shape.block_size})" if limit == shape.table_tokens
                else f"max_context_len allows ({limit} tokens)")
        raise ValueError(f"context_lens[{s}]={lens[s]} is longer than {what}")
    for s, n in enumerate(lens):
        used = table[s, : num_blocks_for(int(n), shape.block_size)]
        bad = (used < 0) | (used >= shape.num_blocks)
        if bad.any():
            j = int(np.argmax(bad))
            raise IndexError(f"block_tables[{s}, {j}]={used[j]} is out of range [0, "
                             f"{shape.num_blocks}) but sequence {s} needs that block "
                             f"(context_lens[{s}]={n})")


# ----------------------------------------------------------------------------- GQA


def heads_per_cta(group: int, limit: int = MAX_HEADS_PER_CTA) -> int:
    """The largest divisor of ``group`` that is <= ``limit``: query heads one GQA CTA serves
    (they share its K/V loads).

    Args:
        group: query heads per KV head.
        limit: the most heads a CTA may hold (registers grow with it).

    Returns:
        The number of query heads per CTA.

    Raises:
        TypeError: ``group`` or ``limit`` is not an int.
        ValueError: ``group`` or ``limit`` is below 1.
    """
    group = check_int("group", group, min_value=1)
    limit = check_int("limit", limit, min_value=1)
    return max(d for d in range(1, min(group, limit) + 1) if group % d == 0)


# ----------------------------------------------------------------------------- naive and v0


def paged_attention_naive(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                          out=None, debug=None):
    """The baseline: the seed's per-(token, head) kernel (decode_naive.cu, given).

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
    shape, tensors = check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                                       scale, out=out, debug=debug)
    return launch_naive(shape, tensors, query)


def paged_attention_v0(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.0: the seed's two-pass kernel, its bugs fixed (decode_v0.cu).

    Args and Returns: as :func:`paged_attention_naive`.

    Raises:
        ValueError: the block table addresses more than V0_MAX_TOKENS tokens (v0 keeps one
            score per token in shared memory), besides everything :func:`check_decode_args`
            raises.
    """
    shape, tensors = check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                                       scale, out=out, debug=debug, check_device=False)
    return launch_v0(KERNEL_DIR / "decode_v0.cu", shape, tensors, query)


# ----------------------------------------------------------------------------- v1, v2


def paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.1: one pass with the online softmax, one CTA per (sequence, query head).

    Args and Returns: as :func:`paged_attention_naive`.
    """
    shape, (q, k, v, bt, cl, out) = check_decode_args(query, key_cache, value_cache, block_tables,
                                                      context_lens, scale, out=out, debug=debug)
    out = new_out(q, out)
    if shape.num_seqs:
        kernel = get_kernel(KERNEL_DIR / "decode_v1.cu", "paged_decode_v1", kernel_options(shape))
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads), (NUM_THREADS,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *table_args(shape), np.float32(shape.scale)))
    return finish(out, query)


def paged_attention_v2(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.2: GQA-aware, one CTA per (sequence, group of query heads of one KV head).

    Args and Returns: as :func:`paged_attention_naive`.
    """
    shape, (q, k, v, bt, cl, out) = check_decode_args(query, key_cache, value_cache, block_tables,
                                                      context_lens, scale, out=out, debug=debug)
    out = new_out(q, out)
    if shape.num_seqs:
        hpc = heads_per_cta(shape.group)
        kernel = get_kernel(KERNEL_DIR / "decode_v2.cu", "paged_decode_v2", kernel_options(shape, HEADS_PER_CTA=hpc))
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads // hpc), (NUM_THREADS,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *table_args(shape), np.int32(shape.group),
                      np.float32(shape.scale)))
    return finish(out, query)


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
        NumPy and torch integer scalars give the same plan as Python ints (the arithmetic is
        done in Python ints, never in the caller's wrapping integer type).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range, the message naming it: ``num_seqs`` and
            ``max_context_len`` >= 0; ``num_kv_heads``, ``num_sms`` and ``target_ctas_per_sm``
            >= 1; ``block_size`` one of SUPPORTED_BLOCK_SIZES; ``max_partition_size`` a
            multiple of PARTITION_ALIGN, at least PARTITION_ALIGN.
    """
    # NOTE: rebind each to check_int's Python int: a np.uint32 or np.int8 argument would
    # otherwise carry its wrapping arithmetic into every product below.
    num_seqs = check_int("num_seqs", num_seqs, min_value=0)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    max_context_len = check_int("max_context_len", max_context_len, min_value=0)
    num_sms = check_int("num_sms", num_sms, min_value=1)
    block_size = check_int("block_size", block_size, min_value=1)
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size={block_size} is not one of {SUPPORTED_BLOCK_SIZES}")
    target_ctas_per_sm = check_int("target_ctas_per_sm", target_ctas_per_sm, min_value=1)
    max_partition_size = check_int("max_partition_size", max_partition_size,
                                   min_value=PARTITION_ALIGN)
    if max_partition_size % PARTITION_ALIGN:
        raise ValueError(f"max_partition_size={max_partition_size} is not a multiple of "
                         f"PARTITION_ALIGN={PARTITION_ALIGN}")
    if max_context_len == 0:
        return SplitKVPlan(1, PARTITION_ALIGN)
    rows = max(1, num_seqs * num_kv_heads)
    wanted = -(-target_ctas_per_sm * num_sms // rows)  # partitions that would fill the GPU
    size = -(-max_context_len // wanted)  # the ideal length; aligned up unless that loses a
    up = -(-size // PARTITION_ALIGN) * PARTITION_ALIGN  # partition, else aligned down
    size = up if -(-max_context_len // up) >= wanted else size // PARTITION_ALIGN * PARTITION_ALIGN
    size = min(max(size, PARTITION_ALIGN), max_partition_size)
    return SplitKVPlan(max(1, -(-max_context_len // size)), size)


def _split_kv_launch(kernel: SplitKVKernel, query, key_cache, value_cache, block_tables,
                     context_lens, scale=None, *, max_context_len=None, plan=None,
                     return_lse=False, out=None, debug=None, tuning=None):
    """v3..v6 differ only in their kernel: validate, plan, launch, merge the partitions.

    Args:
        kernel: which kernel and its limits (``V3_KERNEL`` .. ``V6_KERNEL`` of ``_launch.py``):
            file and name, head sizes, partition cap, the plan's CTA target, default and
            tunable -D options, dynamic shared memory.
        query, key_cache, value_cache, block_tables, context_lens, scale, max_context_len,
            plan, return_lse, out, debug: the public launcher's (:func:`paged_attention_v3`).
        tuning: -D overrides for this call (:meth:`SplitKVKernel.defines_for`), or None.

    Returns:
        The output, or ``(output, lse)`` with ``return_lse``.
    """
    import torch

    shape, (q, k, v, bt, cl, out) = check_decode_args(
        query, key_cache, value_cache, block_tables, context_lens, scale, out=out,
        max_context_len=max_context_len, debug=debug, check_device=False)
    if shape.head_size not in kernel.head_sizes:
        raise UnsupportedConfigError(f"head_size={shape.head_size} is not supported by "
                                     f"{kernel.name}; it has code for {kernel.head_sizes}")
    check_plan(shape, plan, max_context_len, kernel.max_partition_size)
    defines = kernel.defines_for(tuning)
    check_on_cuda(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl, out=out)
    if plan is None:
        max_len = shape.table_tokens if max_context_len is None else int(max_context_len)
        plan = plan_split_kv(shape.num_seqs, shape.num_kv_heads, max_len,
                             num_sms(q.device), block_size=shape.block_size,
                             target_ctas_per_sm=kernel.target_ctas_per_sm,
                             max_partition_size=kernel.max_partition_size or MAX_PARTITION_SIZE)
    out = new_out(q, out)
    lse = torch.empty((shape.num_seqs, shape.num_q_heads), dtype=torch.float32, device=q.device)
    if shape.num_seqs:
        hpc = heads_per_cta(shape.group, defines.pop("MAX_HEADS_PER_CTA", MAX_HEADS_PER_CTA))
        threads = 32 * defines.get("NUM_WARPS", NUM_THREADS // 32)
        n = plan.num_partitions
        null = np.uint64(0)
        parts = (null, null, null)
        if n > 1:
            part_ml = torch.empty((2, shape.num_seqs, shape.num_q_heads, n), dtype=torch.float32,
                                  device=q.device)
            part_acc = torch.empty((shape.num_seqs, shape.num_q_heads, n, shape.head_size),
                                   dtype=torch.float32, device=q.device)
            parts = (rcuda.ptr(part_ml[0]), rcuda.ptr(part_ml[1]), rcuda.ptr(part_acc))
        defines["HEADS_PER_CTA"] = hpc
        if kernel.max_partition_size is not None:
            defines["MAX_PARTITION_SIZE"] = kernel.max_partition_size
        compiled = get_kernel(KERNEL_DIR / kernel.file, kernel.name, kernel_options(shape, **defines))
        rcuda.launch(compiled, (shape.num_seqs, shape.num_q_heads // hpc, n), (threads,),
                     (rcuda.ptr(out), rcuda.ptr(lse), *parts, rcuda.ptr(q), rcuda.ptr(k),
                      rcuda.ptr(v), rcuda.ptr(bt), rcuda.ptr(cl), *table_args(shape),
                      np.int32(shape.group), np.float32(shape.scale),
                      np.int32(plan.partition_size)),
                     shared_mem=kernel.shared_mem(shape, defines) if kernel.shared_mem else 0)
        if n > 1:
            reduce = get_kernel(KERNEL_DIR / "decode_reduce.cu", "paged_decode_reduce",
                                kernel_options(shape))
            rcuda.launch(reduce, (shape.num_seqs, shape.num_q_heads), (32,),
                         (rcuda.ptr(out), rcuda.ptr(lse), *parts, rcuda.ptr(cl), np.int32(n),
                          np.int32(plan.partition_size)))
    else:
        lse.fill_(-math.inf)
    if return_lse:
        return finish(out, query), finish(lse, query)
    return finish(out, query)


def paged_attention_v3(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.3: split-K (flash-decoding): v2 per partition, then decode_reduce.cu.

    Args:
        query, key_cache, value_cache, block_tables, context_lens, scale, out, debug: as
            :func:`paged_attention_naive`.
        max_context_len: the longest context (default: what the block table can address);
            sizes the plan.
        plan: a :class:`SplitKVPlan` to use instead of :func:`plan_split_kv`'s.
        return_lse: also return the log-sum-exp, [num_seqs, num_q_heads] float32 (natural log;
            -inf for an empty sequence).
        tuning: compile-time overrides for this call (``{"NUM_WARPS": 8}``, ...): only the
            names the kernel's ``tunable`` lists (v3: none; v4: NUM_WARPS, VECS_PER_LANE,
            MAX_HEADS_PER_CTA; v6: NUM_WARPS, NUM_STAGES, MAX_HEADS_PER_CTA). For sweeps
            (``pagedlab bench decode --variants``); None: the kernel's defaults.

    Returns:
        The output, or ``(output, lse)`` with ``return_lse``.
    """
    return _split_kv_launch(V3_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def paged_attention_v4(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.4: the fast kernel — v3's split-K with 16-byte loads and tiles in flight.

    Args and Returns: as :func:`paged_attention_v3`; a forced ``plan`` must keep
    ``partition_size <= MAX_PARTITION_SIZE`` (the kernel stages a partition's block ids).
    """
    return _split_kv_launch(V4_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def paged_attention_v5(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.5: v4 with both matrix products on tensor cores (mma.sync m16n8k16, fp32 accumulate).

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    return _split_kv_launch(V5_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def paged_attention_v6(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.6: v5's tensor-core math fed by a cp.async pipeline through shared memory.

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    return _split_kv_launch(V6_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def _prefers_v6(query, key_cache) -> bool:
    """A head size v6 has code for and a group of at least V6_MIN_GROUP (shapes only: the
    launcher validates)."""
    q_shape, k_shape = tuple(getattr(query, "shape", ())), tuple(getattr(key_cache, "shape", ()))
    return (len(q_shape) == 3 and len(k_shape) == 4 and k_shape[1] > 0
            and q_shape[2] in V6_HEAD_SIZES and q_shape[1] // k_shape[1] >= V6_MIN_GROUP)


def paged_attention(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                    max_context_len=None, plan=None, return_lse=False, out=None, debug=None):
    """The production entry point: v6 (pipelined tensor cores) from a GQA group of
    V6_MIN_GROUP up, where it has code; else v4.

    v4's CUDA-core multiply-adds grow with the group and cap it below the copy ceiling from a
    group of 2 or 3 on fast HBM; v6's tensor cores do not care. On MHA the multiply-adds are
    few, and v4, which issues every load of a tile at once, is as fast or faster on large
    batches.
    Head size 256 goes to v4, and so does everything on a GPU below compute capability 8.0
    (v6 needs sm_80).

    Cost: every call validates fully, plans the split, looks up its kernel and allocates its
    scratch: 185-440 µs of host time per call (H200 machines, 2026-11-29); for repeated calls on
    one batch shape use :func:`plan_decode` and its ``run``.

    Args and Returns: as :func:`paged_attention_v4`.
    """
    # NOTE: v6 needs sm_80 (cp.async, mma.sync); on an older GPU (a T4) v4 serves every shape.
    use_v6 = _prefers_v6(query, key_cache) and rcuda.runs_sm80_stages(query)
    fn = paged_attention_v6 if use_v6 else paged_attention_v4
    return fn(query, key_cache, value_cache, block_tables, context_lens, scale,
              max_context_len=max_context_len, plan=plan, return_lse=return_lse, out=out,
              debug=debug)


def plan_decode(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                max_context_len=None, plan=None, version=None, tuning=None,
                debug=None) -> DecodePlan:
    """Plan once, run many: validates a batch shape once and returns a plan whose ``run``
    launches your split-K kernels at a small host cost (given code, ``_plan.py``).

    ``plan.run(query, key_cache, value_cache, block_tables, context_lens, out=...)`` checks
    only shapes, dtypes, devices, contiguity and alignment against the plan (no device reads,
    no synchronisation, nothing allocated when ``out`` is given: capturable in a CUDA graph).
    The plan is made with your ``_prefers_v6`` and ``check_decode_args``, then calls your
    ``_split_kv_launch`` once with its launches recorded (nothing runs) and keeps them, so it
    works once they do; ``run`` re-launches them with its tensors' pointers.

    Args:
        query, key_cache, value_cache, block_tables, context_lens, scale, max_context_len,
            plan, tuning, debug: as :func:`paged_attention_v4`; the tensors are examples of
            the batch shape every run will have (a ``max_context_len`` bounds every run's
            contexts; default: what the block table can address).
        version: ``"v3"`` .. ``"v6"``, or None for :func:`paged_attention`'s choice.

    Returns:
        A ``DecodePlan`` (immutable).
    """
    return _plan_decode(globals(), query, key_cache, value_cache, block_tables, context_lens,
                        scale, max_context_len=max_context_len, plan=plan, version=version,
                        tuning=tuning, debug=debug)


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
