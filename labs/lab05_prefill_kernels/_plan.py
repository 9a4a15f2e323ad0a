"""Lab 5's plan / run split (given to you, not lab content): ``plan_prefill`` once per batch,
then ``plan.run(...)`` for every call on it (every layer of a step) — the launch path at
FlashInfer's host cost.

It is built on your TODO functions: the plan validates with your ``check_prefill_inputs``,
cuts the query tiles with your ``plan_query_tiles`` (through ``plan_for_kernel``), runs the
given checks that follow the plan (``check_launch``), uploads the work list once and resolves
your tiled or tensor-core kernel; ``run`` launches it exactly as your ``paged_prefill_tiled`` /
``paged_prefill_tc`` do (the tests prove it, bit for bit). The lab module passes its namespace
in (``plan_prefill(globals(), ...)``). Protected, like ``_launch.py``.

vLLM / FlashInfer: ``plan_prefill`` is FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper.plan`` (qo_indptr, the paged KV layout, head counts: the
work list is made on the host, once per step); ``run`` is the wrapper's ``run``, once per
layer. Unlike decode, the work list depends on the values of ``cu_seqlens_q`` and
``context_lens``: a run must have the values the plan was made with (``debug`` checks it).
"""

from __future__ import annotations

import numpy as np

from labs.lab05_prefill_kernels._launch import (
    DTYPE_TAG,
    TC_TILING,
    TILED_THREADS,
    TcTiling,
    check_block_ids,
    check_launch,
    device_of,
    host_ints,
    scalars,
    tiled_shared_bytes,
)
from reference.checks import debug_enabled
from reference.cuda import as_torch, get_kernel, like_input
from reference.launch_plan import (
    FrozenPlan,
    KernelLaunch,
    check_like,
    ptr_function,
    spec_of,
)

#: The kernels a plan can be made for (the naive one needs no plan to be slow).
PLAN_KERNELS = ("tiled", "tc")


class PrefillPlan(FrozenPlan):
    """One prefill batch, planned: validated once, launched many times by :meth:`run`.

    Attributes:
        kernel: ``"tiled"`` or ``"tc"``.
        shapes: the batch's ``PrefillShapes``.
        tile_plan: the ``TilePlan`` (the work list, heaviest first; its host copies of
            ``cu_seqlens_q`` and ``context_lens``).
        scale: the softmax scale, fixed at plan time.
        causal: the masking, fixed at plan time.
        tc_tiling: the tensor-core CTA shape (``"tc"``).
        debug: whether ``run`` re-runs the full, device-reading checks by default.
    """

    def __init__(self, ns: dict, query, key_cache, value_cache, block_tables, cu_seqlens_q,
                 context_lens, scale, *, kernel: str = "tc", alibi_slopes=None,
                 causal: bool = True, tc_tiling: TcTiling = TC_TILING, debug=None):
        if kernel not in PLAN_KERNELS:
            raise ValueError(f"kernel must be one of {PLAN_KERNELS}, got {kernel!r}")
        if not isinstance(tc_tiling, TcTiling):
            raise TypeError(f"tc_tiling must be a TcTiling, got {type(tc_tiling).__name__}")
        shapes = ns["check_prefill_inputs"](query, key_cache, value_cache, block_tables,
                                            cu_seqlens_q, context_lens, scale, kernel=kernel,
                                            alibi_slopes=alibi_slopes)
        tile_plan = ns["plan_for_kernel"](kernel, cu_seqlens_q, context_lens,
                                          num_q_heads=shapes.num_q_heads,
                                          num_kv_heads=shapes.num_kv_heads, causal=causal,
                                          tc_tiling=tc_tiling)
        # The checks that follow the plan (its fit, block ids when debugging, the device, last);
        # the output it returns is an example only (a run allocates its own or takes ``out``).
        check_launch(kernel, shapes, tile_plan, query=query, key_cache=key_cache,
                     value_cache=value_cache, block_tables=block_tables,
                     cu_seqlens_q=cu_seqlens_q, context_lens=context_lens,
                     alibi_slopes=alibi_slopes, causal=causal, out=None, debug=debug,
                     tc_tiling=tc_tiling)
        q = as_torch(query)
        num_work = len(tile_plan.work)
        launches = ()
        work = tile_plan.device_work(q.device)  # uploaded once: the plan's device metadata
        if num_work:
            with device_of(q):
                if kernel == "tc":
                    compiled = get_kernel(ns["KERNEL_DIR"] / "prefill_tc.cu",
                                          tc_tiling.kernel_name(shapes.dtype, shapes.head_size))
                    launch = KernelLaunch(compiled, (num_work * shapes.num_kv_heads,),
                                          (32 * tc_tiling.warps,),
                                          tc_tiling.shared_bytes(shapes.head_size), q.device)
                else:
                    name = f"prefill_tiled_{DTYPE_TAG[shapes.dtype]}_d{shapes.head_size}"
                    compiled = get_kernel(ns["KERNEL_DIR"] / "prefill_tiled.cu", name)
                    launch = KernelLaunch(compiled, (num_work * shapes.num_q_heads,),
                                          (TILED_THREADS,),
                                          tiled_shared_bytes(shapes.head_size, shapes.dtype),
                                          q.device)
            launches = (launch,)
        ptr = ptr_function(q.device)
        specs = tuple(spec_of(as_torch(x), a) for x, a in (
            (query, 16), (key_cache, 16), (value_cache, 16), (block_tables, 1),
            (cu_seqlens_q, 1), (context_lens, 1)))
        alibi_spec = None if alibi_slopes is None else spec_of(as_torch(alibi_slopes))
        self._set(kernel=kernel, shapes=shapes, tile_plan=tile_plan, scale=float(scale),
                  causal=bool(causal), tc_tiling=tc_tiling, debug=debug_enabled(debug),
                  _ns=ns, _ptr=ptr, _launches=launches, _work=work, _work_ptr=ptr(work),
                  _specs=specs, _alibi_spec=alibi_spec,
                  _tail=tuple(scalars(scale, shapes, causal)))

    def run(self, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, *,
            alibi_slopes=None, out=None, debug=None):
        """Launches the planned kernel on the current torch stream.

        Checks only what a call can change cheaply (each tensor's shape, dtype, device,
        contiguity and alignment against the plan: attribute reads, no device memory read, no
        synchronisation), so it can be captured in a CUDA graph; with ``out`` given it
        allocates nothing. ``cu_seqlens_q`` and ``context_lens`` must hold the values the plan
        was made with (the work list came from them); ``debug`` checks that, and the block
        ids, by reading the device.

        Args:
            query: [num_tokens, num_q_heads, head_size], as planned.
            key_cache: [num_blocks, num_kv_heads, block_size, head_size], as planned.
            value_cache: [num_blocks, num_kv_heads, block_size, head_size], as planned.
            block_tables: [num_seqs, max_blocks_per_seq] int32, as planned.
            cu_seqlens_q: [num_seqs + 1] int32, the planned values.
            context_lens: [num_seqs] int32, the planned values.
            alibi_slopes: [num_q_heads] float32 if the plan was made with slopes, else None.
            out: [num_tokens, num_q_heads, head_size] like ``query``, or None to allocate.
            debug: re-run the full checks (device reads) first; None: the plan's ``debug``.

        Returns:
            The output, of the same kind (torch or CuPy) as ``query``.

        Raises:
            TypeError: not a tensor, or another dtype than planned.
            ValueError: another shape than planned, non-contiguous or misaligned, ALiBi slopes
                given to a plan without them (or missing), or (debug) other lengths than
                planned.
            DeviceMismatchError: another device than planned.
        """
        if debug or (debug is None and self.debug):
            self._check_values(query, key_cache, value_cache, block_tables, cu_seqlens_q,
                               context_lens, alibi_slopes, out)
        sq, sk, sv, sbt, scu, scl = self._specs
        q = check_like("query", query, sq)
        args = [None, self._ptr(q), self._ptr(check_like("key_cache", key_cache, sk)),
                self._ptr(check_like("value_cache", value_cache, sv)),
                self._ptr(check_like("block_tables", block_tables, sbt)),
                self._ptr(check_like("cu_seqlens_q", cu_seqlens_q, scu)),
                self._ptr(check_like("context_lens", context_lens, scl))]
        if (alibi_slopes is None) != (self._alibi_spec is None):
            raise ValueError("alibi_slopes must be given exactly when the plan was made with "
                             "them (the kernel's ALiBi path is chosen at plan time)")
        args.append(np.uint64(0) if alibi_slopes is None
                    else self._ptr(check_like("alibi_slopes", alibi_slopes, self._alibi_spec)))
        if out is None:
            import torch

            o = torch.empty_like(q)
        else:
            o = check_like("out", out, sq)
        if self._launches:
            args[0] = self._ptr(o)
            self._launches[0]((*args, self._work_ptr, *self._tail))
        return out if out is not None else like_input(o, query)

    def _check_values(self, query, key_cache, value_cache, block_tables, cu_seqlens_q,
                      context_lens, alibi_slopes, out) -> None:
        """``debug``: the full checks again, and the lengths must be the planned ones."""
        shapes = self._ns["check_prefill_inputs"](query, key_cache, value_cache, block_tables,
                                                  cu_seqlens_q, context_lens, self.scale,
                                                  kernel=self.kernel, alibi_slopes=alibi_slopes,
                                                  out=out)
        for name, x, planned in (("cu_seqlens_q", cu_seqlens_q, self.tile_plan.cu_seqlens_q),
                                 ("context_lens", context_lens, self.tile_plan.context_lens)):
            now = host_ints(name, x)
            if now.shape != planned.shape or (now != planned).any():
                raise ValueError(f"{name} holds {now.tolist()[:8]}... but the plan was made "
                                 f"for {planned.tolist()[:8]}...: new lengths need a new plan")
        check_block_ids(block_tables, self.tile_plan, shapes.num_blocks, shapes.block_size)

    def __repr__(self) -> str:
        s = self.shapes
        return (f"PrefillPlan({self.kernel}, {s.num_seqs} seqs, {s.num_tokens} tokens, "
                f"{s.num_q_heads}q/{s.num_kv_heads}kv, head {s.head_size}, {s.dtype}, "
                f"{len(self.tile_plan.work)} tiles)")


def plan_prefill(ns: dict, *args, **kwargs) -> PrefillPlan:
    """Makes a :class:`PrefillPlan` with the lab module namespace ``ns`` (its TODO functions).

    Args:
        ns: the lab module's ``globals()``.
        *args, **kwargs: as :class:`PrefillPlan`.

    Returns:
        The plan.
    """
    return PrefillPlan(ns, *args, **kwargs)
