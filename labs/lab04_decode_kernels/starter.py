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
    # TODO(lab4.0): the launcher contract. In this order:
    #  1. structure: every argument a tensor (as_tensor), ranks / dtypes / contiguity
    #     (check_array), shapes that agree, supported head and block sizes
    #     (UnsupportedConfigError), an ``out`` like query, q / caches / out starting on a
    #     16-byte boundary (the kernels load 16 bytes at a time), a finite scale > 0 (default
    #     1/sqrt(head_size); check_scale(..., dtype=np.float32): the kernels take float32),
    #     max_context_len an int >= 0 (rebind it: max_context_len = check_int(...));
    #  2. values, only for CPU tensors or when debug_enabled(debug): _check_values(...);
    #  3. the device, last and only if check_device: check_on_cuda(...).
    # Return (DecodeShape(...), (q, k, v, bt, cl, o)).
    raise NotImplementedError("TODO(lab4.0): check_decode_args — validate everything before launch")


def _check_values(shape: DecodeShape, bt, cl, max_context_len: int | None) -> None:
    """The checks that read the block table and context lengths (a host copy)."""
    # TODO(lab4.0): read context_lens and block_tables to the host; context_lens in
    # [0, min(table_tokens, max_context_len)] (ValueError naming context_lens[s]: the first
    # negative one, else the first one too long; max_context_len=0 is a limit too); every block id
    # a sequence needs (its first ceil(len / block_size) slots) in [0, num_blocks) (IndexError
    # naming block_tables[s, j]). Padding past those slots is never read: ignore it.
    raise NotImplementedError("TODO(lab4.0): _check_values — block ids and context lengths")


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
    # TODO(lab4.2): check group and limit with check_int (min_value=1; keep the Python ints it
    # returns), then return the largest divisor of group that is <= limit.
    raise NotImplementedError("TODO(lab4.2): heads_per_cta — how many query heads share a CTA")


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
    # TODO(lab4.0): decode_v0.cu has five bugs. Fix them, then delete the next line.
    raise NotImplementedError("TODO(lab4.0): fix the five bugs of decode_v0.cu, then delete this line")
    shape, tensors = check_decode_args(query, key_cache, value_cache, block_tables, context_lens,
                                       scale, out=out, debug=debug, check_device=False)
    return launch_v0(KERNEL_DIR / "decode_v0.cu", shape, tensors, query)


# ----------------------------------------------------------------------------- v1, v2


def paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       out=None, debug=None):
    """Task 4.1: one pass with the online softmax, one CTA per (sequence, query head).

    Args and Returns: as :func:`paged_attention_naive`.
    """
    # TODO(lab4.1): validate (check_decode_args), allocate the output (new_out), launch
    # paged_decode_v1 of KERNEL_DIR / "decode_v1.cu" (get_kernel, kernel_options) on grid
    # (num_seqs, num_q_heads) with NUM_THREADS threads — the arguments in the kernel's order,
    # as launch_naive in _launch.py passes them — and return finish(out, query).
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
        NumPy and torch integer scalars give the same plan as Python ints (the arithmetic is
        done in Python ints, never in the caller's wrapping integer type).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range, the message naming it: ``num_seqs`` and
            ``max_context_len`` >= 0; ``num_kv_heads``, ``num_sms`` and ``target_ctas_per_sm``
            >= 1; ``block_size`` one of SUPPORTED_BLOCK_SIZES; ``max_partition_size`` a
            multiple of PARTITION_ALIGN, at least PARTITION_ALIGN.
    """
    # TODO(lab4.3): validate the arguments (check_int) and rebind each to the Python int it
    # returns (a np.uint8 argument must not make the arithmetic wrap), then: partitions that would give
    # target_ctas_per_sm * num_sms CTAs; their length aligned to PARTITION_ALIGN (up, unless that
    # loses a partition), clamped to [PARTITION_ALIGN, max_partition_size]; enough of them to
    # cover max_context_len (at least 1; max_context_len=0 gives (1, PARTITION_ALIGN), after
    # every argument is checked).
    raise NotImplementedError("TODO(lab4.3): plan_split_kv — how split-K cuts the contexts")


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
    # TODO(lab4.3): in this order, so that every check runs before the device check:
    #  1. check_decode_args(..., max_context_len=..., check_device=False); a head size not in
    #     kernel.head_sizes is an UnsupportedConfigError naming kernel.name;
    #     check_plan(shape, plan, max_context_len, kernel.max_partition_size);
    #     defines = kernel.defines_for(tuning); then check_on_cuda(...).
    #  2. no forced plan: plan_split_kv for max_context_len (default shape.table_tokens) with
    #     num_sms(q.device), the block size, kernel.target_ctas_per_sm and
    #     kernel.max_partition_size (MAX_PARTITION_SIZE when None).
    #  3. the output (new_out) and an lse buffer [num_seqs, num_q_heads] float32 (all -inf when
    #     num_seqs == 0, and launch nothing); when num_partitions > 1, partial buffers
    #     m, l [num_seqs, num_q_heads, n] and acc [num_seqs, num_q_heads, n, head_size] float32
    #     (else null pointers).
    #  4. hpc = heads_per_cta(group, defines.pop("MAX_HEADS_PER_CTA", MAX_HEADS_PER_CTA));
    #     threads = 32 * defines.get("NUM_WARPS", NUM_THREADS // 32); add HEADS_PER_CTA=hpc and,
    #     when the kernel has a cap, MAX_PARTITION_SIZE to defines; launch
    #     get_kernel(KERNEL_DIR / kernel.file, kernel.name, kernel_options(shape, **defines))
    #     on grid (num_seqs, num_q_heads // hpc, num_partitions) with kernel.shared_mem(shape,
    #     defines) bytes of dynamic shared memory (0 when None).
    #  5. split: paged_decode_reduce of decode_reduce.cu on grid (num_seqs, num_q_heads), 32
    #     threads. Return finish(out, query), and finish(lse, query) too with return_lse.
    #  Launch with rcuda.launch and rcuda.ptr of the validated tensors themselves (no copies):
    #  plan_decode records these launches once and re-points those pointers on every run.
    raise NotImplementedError("TODO(lab4.3): _split_kv_launch — split-K plan, kernel and merge")


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
    # TODO(lab4.4): write the kernel of decode_v4.cu, then delete the next line (the launcher is
    # v3's: only the kernel description differs).
    raise NotImplementedError("TODO(lab4.4): paged_attention_v4 — write decode_v4.cu's kernel")
    return _split_kv_launch(V4_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def paged_attention_v5(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.5: v4 with both matrix products on tensor cores (mma.sync m16n8k16, fp32 accumulate).

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    # TODO(lab4.5): write the kernel of decode_v5.cu, then delete the next line.
    raise NotImplementedError("TODO(lab4.5): paged_attention_v5 — write decode_v5.cu's kernel")
    return _split_kv_launch(V5_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def paged_attention_v6(query, key_cache, value_cache, block_tables, context_lens, scale=None, *,
                       max_context_len=None, plan=None, return_lse=False, out=None, debug=None,
                       tuning: Mapping[str, int] | None = None):
    """Task 4.6: v5's tensor-core math fed by a cp.async pipeline through shared memory.

    Args and Returns: as :func:`paged_attention_v4`; head sizes 64 and 128 only.
    """
    # TODO(lab4.6): write the kernel of decode_v6.cu, then delete the next line.
    raise NotImplementedError("TODO(lab4.6): paged_attention_v6 — write decode_v6.cu's kernel")
    return _split_kv_launch(V6_KERNEL, query, key_cache, value_cache, block_tables, context_lens,
                            scale, max_context_len=max_context_len, plan=plan,
                            return_lse=return_lse, out=out, debug=debug, tuning=tuning)


def _prefers_v6(query, key_cache) -> bool:
    """A head size v6 has code for and a group of at least V6_MIN_GROUP (shapes only: the
    launcher validates)."""
    # TODO(lab4.6): True when query / key_cache have 3 / 4 dimensions, the head size is one of
    # V6_HEAD_SIZES and the group (num_q_heads // num_kv_heads) is at least V6_MIN_GROUP. Then
    # `pagedlab bench decode --workloads --no-sweep --groups` times v4 against v6 per group on
    # your GPU: move V6_MIN_GROUP if the faster kernel is not the one picked (its group 1 is one
    # small MHA batch: the handout's table has larger ones, where v4 can win).
    raise NotImplementedError("TODO(lab4.6): _prefers_v6 — when paged_attention uses v6")


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
