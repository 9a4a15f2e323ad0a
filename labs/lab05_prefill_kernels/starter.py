"""Lab 5 — paged prefill on the GPU: a naive kernel, a tiled one, one on tensor cores, and one
on Hopper's warpgroup tensor cores.

All four compute Lab 3's varlen prefill over the paged cache of ``reference/layout.py``:
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
last can be graded on a machine without a GPU. The plumbing is given, in protected files this
module imports: ``_launch.py`` (tile shapes, ``PrefillShapes``, ``TilePlan``, ``TcTiling``,
``kernel_tiling``, ``check_plan_fits``, ``check_block_ids``, ``check_launch`` — the checks after
the plan — and launch helpers) and ``reference/checks.py`` (the array, scale and device checks
Lab 4 shares); ``prefill_common.cuh`` is given too.

Your tasks are marked ``TODO(lab5.k)``; ``LAB_IMPL=starter pagedlab grade 5`` lists the ones left.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from labs.lab05_prefill_kernels._launch import (  # noqa: F401  (re-exported: tests, benchmark)
    ALIGN,
    DTYPE_TAG,
    KERNEL_DTYPES,
    SUPPORTED_BLOCK_SIZES,
    SUPPORTED_HEAD_SIZES,
    TC_BLOCK_N,
    TC_ROWS_PER_WARP,
    TC_TILING,
    TC_WARPS,
    WGMMA_BLOCK_M,
    WGMMA_BLOCK_N,
    WGMMA_THREADS,
    TILED_BLOCK_M,
    TILED_BLOCK_N,
    TILED_THREADS,
    PrefillShapes,
    TcTiling,
    TilePlan,
    check_block_ids,
    check_launch,
    check_plan_fits,
    common_args,
    data_ptr,
    device_of,
    host_ints,
    kernel_tiling,
    scalars,
    tiled_shared_bytes,
    wgmma_counter,
    wgmma_shared_bytes,
)
from labs.lab05_prefill_kernels._plan import PrefillPlan  # noqa: F401  (re-exported)
from labs.lab05_prefill_kernels._plan import plan_prefill as _plan_prefill
from reference.checks import (  # noqa: F401
    check_array,
    check_int,
    check_on_cuda,
    check_scale,
    dtype_name,
)
from reference.cuda import as_torch, get_kernel, launch, like_input, num_sms, ptr  # noqa: F401
from reference.errors import UnsupportedConfigError
from reference.tma import tensor_map  # noqa: F401  (the Hopper kernel's TMA maps)

#: The ``.cu`` files you write sit beside this loader (a mutant copy of the folder carries its
#: own); the given prefill_common.cuh is in labs/lab05_prefill_kernels/.
KERNEL_DIR = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- validation


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
        kernel: ``"naive"``, ``"tiled"``, ``"tc"`` or ``"wgmma"`` (which dtypes are supported).
        alibi_slopes: [num_q_heads] float32, every slope finite, or None.
        out: [num_tokens, num_q_heads, head_size] like ``query``, or None.

    Returns:
        The batch's sizes.

    Raises:
        TypeError: an argument is not a torch tensor / CuPy array, has the wrong dtype, or
            ``scale`` is not a float.
        ValueError: an unknown ``kernel``, wrong rank or shape, not contiguous, misaligned,
            sizes that disagree (``num_q_heads`` zero or not a multiple of ``num_kv_heads``,
            ``cu_seqlens_q`` not ``num_seqs + 1`` long, ...), or an ALiBi slope that is NaN or
            infinite.
        UnsupportedConfigError: head_size, block_size or dtype the kernel has no code for.
    """
    # TODO(lab5.1): check, in this order, raising the error types the docstring lists and naming
    # the argument in every message:
    #   * kernel is one of KERNEL_DTYPES;
    #   * query [T, Hq, D] in any of float16 / bfloat16 / float32 (a float64 query: TypeError
    #     naming query), key_cache / value_cache [num_blocks, Hkv, block_size, D] of query's
    #     dtype (another: TypeError naming the cache) and the same shape as each other (naming
    #     value_cache), block_tables [num_seqs, width] int32, cu_seqlens_q [num_seqs + 1] int32,
    #     context_lens [num_seqs] int32 — each a torch tensor or CuPy array (check_array does
    #     kind, rank, dtype, contiguity);
    #   * head sizes agree (the message says head_size); num_q_heads >= 1 and
    #     num_q_heads % num_kv_heads == 0 (0 % n == 0 too: refuse zero query heads explicitly);
    #     at least one block (naming key_cache) and one column (naming block_tables);
    #   * head_size, block_size and the kernel's dtypes supported (UnsupportedConfigError) —
    #     only here: a float32 query for "tc" passes the checks above;
    #   * scale a finite float > 0 as float32 (check_scale(scale, dtype=np.float32));
    #     alibi_slopes None or [Hq] float32 (check_array, like the arrays above), every slope
    #     finite (NaN/inf -> ValueError; read it through as_torch: it may be a CuPy array);
    #     out None or like query;
    #   * query, caches and out start on a 16-byte boundary (data_ptr).
    # Read no values but the Hq ALiBi slopes, and do not look at the device: that comes later,
    # so all of this is testable with CPU tensors.
    raise NotImplementedError("TODO(lab5.1): check_prefill_inputs — shapes, dtypes, sizes, names")


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
        block_m: rows per tile (an int >= 1).
        block_n: keys per KV tile (an int >= 1).
        causal: a tile visits keys up to its last row's diagonal only.

    Returns:
        The plan (a ``TilePlan``: ``work``, ``num_kv_tiles``, ``max_context_len`` ... — see its
        docstring in ``_launch.py``); empty sequences contribute no tile.

    Raises:
        TypeError: ``rows_per_token``, ``block_m`` or ``block_n`` is not an int.
        ValueError: one of them is below 1, or bad values, naming ``cu_seqlens_q`` or
            ``context_lens`` and the first bad sequence.
    """
    # TODO(lab5.2): first check rows_per_token, block_m and block_n (check_int, min_value=1:
    # block_m=0 or block_n=0 must be a typed error naming it, not a ZeroDivisionError). Then
    # read both arrays to the host (host_ints), check len(cu) == len(ctx) + 1,
    # cu[0] == 0, no negative query length, context_lens >= query length (ValueError naming the
    # array and the first bad sequence). Then for each sequence with q_len > 0: num_rows =
    # q_len * rows_per_token; a tile every block_m rows (the last one partial); the tile's KV
    # extent is history + its last token + 1 (causal) or the whole context, in block_n tiles
    # (round up). Order the work list heaviest first with a *stable* sort.
    raise NotImplementedError("TODO(lab5.2): plan_query_tiles — tiles, KV extents, heaviest first")


def plan_for_kernel(kernel: str, cu_seqlens_q, context_lens, *, num_q_heads: int,
                    num_kv_heads: int, causal: bool = True,
                    tc_tiling: TcTiling = TC_TILING) -> TilePlan:
    """Plans a batch for one kernel, to pass as ``plan=`` to many calls (plan once, run many).

    A launcher given a plan reads nothing back from the GPU: the values were checked here.

    Args:
        kernel: ``"naive"``, ``"tiled"``, ``"tc"`` or ``"wgmma"``.
        cu_seqlens_q: [num_seqs + 1] query offsets.
        context_lens: [num_seqs] keys per sequence.
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        causal: the masking the calls will use.
        tc_tiling: the tensor-core kernel's CTA shape the calls will use (``"tc"`` only).

    Returns:
        The plan.
    """
    rows_per_token, block_m, block_n = kernel_tiling(kernel, num_q_heads, num_kv_heads,
                                                     tc_tiling=tc_tiling)
    return plan_query_tiles(cu_seqlens_q, context_lens, rows_per_token=rows_per_token,
                            block_m=block_m, block_n=block_n, causal=causal)


def _prepare(kernel, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
             scale, alibi_slopes, causal, out, plan, debug, tc_tiling=TC_TILING):
    """The validation sequence every launcher runs; returns (shapes, plan, out as torch)."""
    shapes = check_prefill_inputs(query, key_cache, value_cache, block_tables, cu_seqlens_q,
                                  context_lens, scale, kernel=kernel, alibi_slopes=alibi_slopes,
                                  out=out)
    if plan is None:
        plan = plan_for_kernel(kernel, cu_seqlens_q, context_lens, num_q_heads=shapes.num_q_heads,
                               num_kv_heads=shapes.num_kv_heads, causal=causal, tc_tiling=tc_tiling)
    out_t = check_launch(kernel, shapes, plan, query=query, key_cache=key_cache,
                         value_cache=value_cache, block_tables=block_tables,
                         cu_seqlens_q=cu_seqlens_q, context_lens=context_lens,
                         alibi_slopes=alibi_slopes, causal=causal, out=out, debug=debug,
                         tc_tiling=tc_tiling)
    return shapes, plan, out_t


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
    # TODO(lab5.3): write the kernel body in prefill_naive.cu, then launch it here when
    # shapes.num_tokens > 0: get_kernel(KERNEL_DIR / "prefill_naive.cu", "prefill_naive_<tag>")
    # (tag from DTYPE_TAG), grid (num_tokens, num_q_heads), block (head_size,), dynamic shared
    # memory 4 * head_size bytes, arguments in the kernel's order (common_args, then scale,
    # num_seqs, num_q_heads, num_kv_heads, block_size, max_blocks_per_seq, causal as
    # np.float32 / np.int32), inside `with device_of(as_torch(query)):` through launch() — on
    # torch's current stream. Return like_input(out_t, query), or `out` when one was given.
    raise NotImplementedError("TODO(lab5.3): paged_prefill_naive — launch the naive kernel")


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
    # TODO(lab5.4): write prefill_tiled.cu, then launch "prefill_tiled_<tag>_d<head_size>" with
    # grid (len(plan.work) * num_q_heads,), block (TILED_THREADS,), shared memory
    # tiled_shared_bytes(...), and the plan's work list on the GPU (plan.device_work) between
    # the common pointers and the scalars (scalars). Launch nothing for an empty plan. Use
    # launch and ptr of the inputs themselves (no copies): plan_prefill records this launch
    # once and re-points those pointers on every run.
    raise NotImplementedError("TODO(lab5.4): paged_prefill_tiled — launch the tiled kernel")


def paged_prefill_tc(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                     scale, *, alibi_slopes=None, causal: bool = True, out=None,
                     plan: TilePlan | None = None, debug: bool | None = None,
                     tc_tiling: TcTiling = TC_TILING):
    """Varlen paged prefill on tensor cores (mma.sync, fp16/bf16 in, fp32 accumulate).

    A CTA per (tile of ``tc_tiling.block_m`` rows, KV head), a row being a (token, query head)
    pair of the KV head's GQA group, so the group's heads share every K/V tile. The plan needs
    ``rows_per_token = num_q_heads // num_kv_heads``, ``block_m = tc_tiling.block_m``,
    ``block_n = 64``. Arguments and return value as :func:`paged_prefill_naive`, and
    ``tc_tiling``, the CTA shape (``TC_TILING``: 4 warps of 32 rows; others for tuning sweeps,
    ``pagedlab bench prefill``; a plan passed in must have been made with the same one).

    Cost: every call validates fully and, without ``plan=``, plans (reading ``cu_seqlens_q`` and
    ``context_lens`` to the host: a synchronisation) and uploads the work list — hundreds of µs
    of host time; for repeated calls on one batch use :func:`plan_prefill` and its ``run``.
    """
    shapes, plan, out_t = _prepare("tc", query, key_cache, value_cache, block_tables,
                                   cu_seqlens_q, context_lens, scale, alibi_slopes, causal, out,
                                   plan, debug, tc_tiling)
    # TODO(lab5.5): write prefill_tc.cu, then launch the kernel named
    # tc_tiling.kernel_name(dtype, head_size) ("prefill_tc_<tag>_d<head_size>_w<warps>_r<rows>")
    # with grid (len(plan.work) * num_kv_heads,) — one CTA per (row tile, KV head) —, block
    # (32 * tc_tiling.warps,), shared memory tc_tiling.shared_bytes(head_size), arguments as
    # the tiled kernel.
    raise NotImplementedError("TODO(lab5.5): paged_prefill_tc — launch the tensor-core kernel")


def paged_prefill_wgmma(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                        scale, *, alibi_slopes=None, causal: bool = True, out=None,
                        plan: TilePlan | None = None, debug: bool | None = None):
    """Varlen paged prefill on Hopper's warpgroup tensor cores (wgmma, fp16/bf16 in, fp32
    accumulate; compute capability 9.0, or the emulated device).

    Work items are (tile of ``WGMMA_BLOCK_M`` = 128 rows, KV head), rows being (token, query
    head) pairs of the KV head's GQA group as in :func:`paged_prefill_tc`, taken head by head;
    persistent CTAs (at most one per SM) take them from a work counter until none is left, each
    with a producer warpgroup that copies (K and V pages by TMA) and two consumer warpgroups of
    64 rows. The plan needs
    ``rows_per_token = num_q_heads // num_kv_heads``, ``block_m = 128``, ``block_n = 128``.
    Arguments and return value as :func:`paged_prefill_naive`.

    Raises:
        ComputeCapabilityError: (an UnsupportedConfigError) the device is a GPU that is not
            Hopper (the emulated device runs it), after every other check; names sm_90a.

    Cost: as :func:`paged_prefill_tc`; for repeated calls use :func:`plan_prefill`.
    """
    shapes, plan, out_t = _prepare("wgmma", query, key_cache, value_cache, block_tables,
                                   cu_seqlens_q, context_lens, scale, alibi_slopes, causal, out,
                                   plan, debug)
    # TODO(lab5.6): write prefill_wgmma.cu, then get the kernel named
    # "prefill_wgmma_<tag>_d<head_size>" — before checking for work, so that a GPU that is not
    # Hopper refuses even an empty batch — and, when plan.work is not empty, launch it with
    # num_items = len(plan.work) * num_kv_heads, grid (min(num_items, num_sms(device)),) — one
    # persistent CTA per SM at most —, block (WGMMA_THREADS,), shared memory
    # wgmma_shared_bytes(head_size), arguments as the tensor-core kernel followed by the TMA maps
    # of the two caches, tensor_map(key_cache, box_rows) and tensor_map(value_cache, box_rows)
    # (each with whole_rows=True if your kernel lays K and V out in 8-row groups of whole rows)
    # with box_rows = min(block_size, WGMMA_BLOCK_N), np.int32(num_items) and
    # ptr(wgmma_counter(device)) (a zeroed work counter for the kernel's dynamic scheduler).
    raise NotImplementedError("TODO(lab5.6): paged_prefill_wgmma — launch the Hopper kernel")


def plan_prefill(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, scale,
                 *, kernel: str = "tc", alibi_slopes=None, causal: bool = True,
                 tc_tiling: TcTiling = TC_TILING, debug: bool | None = None) -> PrefillPlan:
    """Plan once, run many: validates a batch once and returns a plan whose ``run`` launches
    your tiled, tensor-core or Hopper kernel at a small host cost (given code, ``_plan.py``).

    ``plan.run(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
    out=...)`` checks only shapes, dtypes, devices, contiguity and alignment against the plan
    (no device reads, no synchronisation, nothing allocated when ``out`` is given: capturable
    in a CUDA graph); the lengths must keep the planned values. The plan is made with your
    ``check_prefill_inputs`` and ``plan_query_tiles``, then calls your ``paged_prefill_tc`` (or
    ``_tiled``) once with its launches recorded (nothing runs) and keeps them, so it works once
    they do; ``run`` re-launches them with its tensors' pointers.

    Args:
        query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, scale,
            alibi_slopes, causal, tc_tiling, debug: as :func:`paged_prefill_tc`; the tensors
            are examples of the batch every run will have.
        kernel: ``"tc"`` (tensor cores), ``"wgmma"`` (Hopper) or ``"tiled"``.

    Returns:
        A ``PrefillPlan`` (immutable).
    """
    return _plan_prefill(globals(), query, key_cache, value_cache, block_tables, cu_seqlens_q,
                         context_lens, scale, kernel=kernel, alibi_slopes=alibi_slopes,
                         causal=causal, tc_tiling=tc_tiling, debug=debug)
