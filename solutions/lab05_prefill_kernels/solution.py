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
    if kernel not in KERNEL_DTYPES:
        raise ValueError(f"kernel must be one of {sorted(KERNEL_DTYPES)}, got {kernel!r}")
    floats = ("float32", "float16", "bfloat16")
    check_array("query", query, 3, floats)
    dtype = dtype_name(query)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_array(name, cache, 4, floats)
        if dtype_name(cache) != dtype:
            raise TypeError(f"{name} has dtype {dtype_name(cache)} but query has {dtype}")
    if tuple(value_cache.shape) != tuple(key_cache.shape):
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} differs from key_cache "
                         f"shape {tuple(key_cache.shape)}")
    check_array("block_tables", block_tables, 2, ("int32",))
    check_array("cu_seqlens_q", cu_seqlens_q, 1, ("int32",))
    check_array("context_lens", context_lens, 1, ("int32",))

    num_tokens, num_q_heads, head_size = (int(n) for n in query.shape)
    num_blocks, num_kv_heads, block_size, cache_head_size = (int(n) for n in key_cache.shape)
    num_seqs, max_blocks_per_seq = (int(n) for n in block_tables.shape)
    if cache_head_size != head_size:
        raise ValueError(f"key_cache head_size {cache_head_size} differs from query head_size "
                         f"{head_size}")
    # NOTE: 0 % num_kv_heads == 0, so zero query heads must be refused on their own.
    if num_q_heads == 0:
        raise ValueError(f"num_q_heads must be >= 1, got query shape {tuple(query.shape)}")
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
    check_scale(scale, dtype=np.float32)  # the kernels take it as float32
    if alibi_slopes is not None:
        check_array("alibi_slopes", alibi_slopes, 1, ("float32",))
        if tuple(alibi_slopes.shape) != (num_q_heads,):
            raise ValueError(f"alibi_slopes must have shape ({num_q_heads},) (one per query "
                             f"head), got {tuple(alibi_slopes.shape)}")
        # NOTE: the one value read here (num_q_heads floats): a NaN slope silently turns every
        # score of its head into NaN, which no later check would notice.
        if not bool(as_torch(alibi_slopes).isfinite().all()):
            raise ValueError("alibi_slopes must all be finite, got NaN or inf in "
                             f"{as_torch(alibi_slopes).tolist()}")
    if out is not None:
        check_array("out", out, 3, (dtype,))
        if tuple(out.shape) != tuple(query.shape):
            raise ValueError(f"out must have query's shape {tuple(query.shape)}, got "
                             f"{tuple(out.shape)}")
    for name, x in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("out", out)):
        if x is not None and data_ptr(x) % ALIGN:
            raise ValueError(f"{name} must start on a {ALIGN}-byte boundary (the kernels load "
                             f"16 bytes at a time); it is a view with an odd offset")
    return PrefillShapes(num_tokens, num_q_heads, num_kv_heads, head_size, num_blocks, block_size,
                         num_seqs, max_blocks_per_seq, dtype)


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
    rows_per_token = check_int("rows_per_token", rows_per_token, min_value=1)
    block_m = check_int("block_m", block_m, min_value=1)
    block_n = check_int("block_n", block_n, min_value=1)
    cu = host_ints("cu_seqlens_q", cu_seqlens_q)
    ctx = host_ints("context_lens", context_lens)
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
    q = as_torch(query)
    if shapes.num_tokens:
        kernel = get_kernel(KERNEL_DIR / "prefill_naive.cu", f"prefill_naive_{DTYPE_TAG[shapes.dtype]}")
        args = common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [np.float32(scale), np.int32(shapes.num_seqs), np.int32(shapes.num_q_heads),
                 np.int32(shapes.num_kv_heads), np.int32(shapes.block_size),
                 np.int32(shapes.max_blocks_per_seq), np.int32(bool(causal))]
        with device_of(q):
            launch(kernel, (shapes.num_tokens, shapes.num_q_heads), (shapes.head_size,), args,
                   shared_mem=4 * shapes.head_size)
    return like_input(out_t, query) if out is None else out


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
        name = f"prefill_tiled_{DTYPE_TAG[shapes.dtype]}_d{shapes.head_size}"
        kernel = get_kernel(KERNEL_DIR / "prefill_tiled.cu", name)
        args = common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [ptr(plan.device_work(q.device))] + scalars(scale, shapes, causal)
        with device_of(q):
            launch(kernel, (num_work * shapes.num_q_heads,), (TILED_THREADS,), args,
                   shared_mem=tiled_shared_bytes(shapes.head_size, shapes.dtype))
    return like_input(out_t, query) if out is None else out


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
    q = as_torch(query)
    num_work = len(plan.work)
    if num_work:
        name = tc_tiling.kernel_name(shapes.dtype, shapes.head_size)
        kernel = get_kernel(KERNEL_DIR / "prefill_tc.cu", name)
        args = common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                            as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                            None if alibi_slopes is None else as_torch(alibi_slopes))
        args += [ptr(plan.device_work(q.device))] + scalars(scale, shapes, causal)
        with device_of(q):
            launch(kernel, (num_work * shapes.num_kv_heads,), (32 * tc_tiling.warps,), args,
                   shared_mem=tc_tiling.shared_bytes(shapes.head_size))
    return like_input(out_t, query) if out is None else out


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
    q = as_torch(query)
    num_work = len(plan.work)
    # NOTE: loaded even for an empty batch, so a GPU that is not Hopper always refuses.
    kernel = get_kernel(KERNEL_DIR / "prefill_wgmma.cu",
                        f"prefill_wgmma_{DTYPE_TAG[shapes.dtype]}_d{shapes.head_size}")
    if num_work:
        args = common_args(out_t, q, as_torch(key_cache), as_torch(value_cache),
                           as_torch(block_tables), as_torch(cu_seqlens_q), as_torch(context_lens),
                           None if alibi_slopes is None else as_torch(alibi_slopes))
        box_rows = min(shapes.block_size, WGMMA_BLOCK_N)  # a TMA box stays inside one page
        num_items = num_work * shapes.num_kv_heads
        args += [ptr(plan.device_work(q.device))] + scalars(scale, shapes, causal)
        # Each map brings a page's whole rows in one request (the kernel's 8-row-group layout).
        args += [tensor_map(key_cache, box_rows, whole_rows=True),
                 tensor_map(value_cache, box_rows, whole_rows=True),
                 np.int32(num_items), ptr(wgmma_counter(q.device))]
        with device_of(q):
            # Persistent: at most one CTA per SM, each looping over its share of the items.
            launch(kernel, (min(num_items, num_sms(q.device)),), (WGMMA_THREADS,), args,
                   shared_mem=wgmma_shared_bytes(shapes.head_size))
    return like_input(out_t, query) if out is None else out


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
