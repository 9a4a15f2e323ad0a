"""Lab 5's plan / run split (given to you, not lab content): ``plan_prefill`` once per batch,
then ``plan.run(...)`` for every call on it (every layer of a step) — the launch path at
FlashInfer's host cost.

It is built on your TODO functions: the plan validates with your ``check_prefill_inputs``,
cuts the query tiles with your ``plan_query_tiles`` (through ``plan_for_kernel``), then calls
your ``paged_prefill_tiled`` / ``paged_prefill_tc`` once with that tile plan and its launches
*recorded* instead of run (``reference.launch_plan.record_launches``): the plan keeps the
kernel, grid, shared memory and work list your launcher chose, and ``run`` re-launches them
with the run's tensors (the tests prove it gives the one-call output bit for bit). So launch
with ``launch(...)`` and pass ``ptr(<the input>)``, as the TODOs say. The lab module passes
its namespace in (``plan_prefill(globals(), ...)``). Protected, like ``_launch.py``.

vLLM / FlashInfer: ``plan_prefill`` is FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper.plan`` (qo_indptr, the paged KV layout, head counts: the
work list is made on the host, once per step); ``run`` is the wrapper's ``run``, once per
layer. Unlike decode, the work list depends on the values of ``cu_seqlens_q`` and
``context_lens``: a run must have the values the plan was made with (``debug`` checks it).
"""

from __future__ import annotations

from labs.lab05_prefill_kernels._launch import TC_TILING, TcTiling, check_block_ids, host_ints
from reference.checks import debug_enabled
from reference.cuda import as_torch, like_input
from reference.launch_plan import (
    FrozenPlan,
    check_like,
    no_launcher_launch,
    ptr_function,
    record_launches,
    replay,
    spec_of,
)

#: The run's tensors, in the order their pointers are re-pointed.
_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q", "context_lens",
           "alibi_slopes", "out")

#: The kernels a plan can be made for (the naive one needs no plan to be slow).
PLAN_KERNELS = ("tiled", "tc", "wgmma")


class PrefillPlan(FrozenPlan):
    """One prefill batch, planned: validated once, launched many times by :meth:`run`.

    Attributes:
        kernel: ``"tiled"``, ``"tc"`` or ``"wgmma"`` (Hopper).
        shapes: the batch's ``PrefillShapes``.
        tile_plan: the ``TilePlan`` (the work list, heaviest first; its host copies of
            ``cu_seqlens_q`` and ``context_lens``).
        scale: the softmax scale, fixed at plan time.
        causal: the masking, fixed at plan time.
        tc_tiling: the tensor-core CTA shape (``"tc"``).
        debug: whether ``run`` re-runs the full, device-reading checks by default.
        launches: the launches your launcher made when the plan was built, in order (each a
            ``reference.launch_plan.KernelLaunch``: ``kernel``, ``grid``, ``block``,
            ``shared_mem``); ``run`` repeats them.
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
        tensors = tuple(None if x is None else as_torch(x) for x in (
            query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
            alibi_slopes))
        import torch

        q = tensors[0]
        launcher = ns[f"paged_prefill_{kernel}"]
        extra = {"tc_tiling": tc_tiling} if kernel == "tc" else {}

        def launch_once(q, k, v, bt, cu, cl, alibi, out):
            return launcher(q, k, v, bt, cu, cl, scale, alibi_slopes=alibi, causal=causal,
                            out=out, plan=tile_plan, debug=debug, **extra)

        who = f"plan_prefill (your paged_prefill_{kernel})"
        _, launches, templates, kept = record_launches(
            who, launch_once, _INPUTS, tensors + (torch.empty_like(q),), _INPUTS, q.device)
        if len(tile_plan.work) and not launches:
            raise no_launcher_launch(who)
        specs = tuple(spec_of(x, a) for x, a in zip(tensors[:6], (16, 16, 16, 1, 1, 1)))
        alibi_spec = None if alibi_slopes is None else spec_of(tensors[6])
        self._set(kernel=kernel, shapes=shapes, tile_plan=tile_plan, scale=float(scale),
                  causal=bool(causal), tc_tiling=tc_tiling, debug=debug_enabled(debug),
                  _ns=ns, _ptr=ptr_function(q.device), _launches=launches,
                  _templates=templates, _kept=kept, _specs=specs, _alibi_spec=alibi_spec)

    @property
    def launches(self) -> tuple:
        """The recorded launches (``KernelLaunch``), in the order ``run`` repeats them."""
        return self._launches

    def run(self, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, *,
            alibi_slopes=None, out=None, debug=None):
        """Launches the planned kernel on the current torch stream.

        Checks only what a call can change cheaply (each tensor's shape, dtype, device,
        contiguity and alignment against the plan: attribute reads, no device memory read, no
        synchronisation), so it can be captured in a CUDA graph; with ``out`` given it
        allocates nothing. ``cu_seqlens_q`` and ``context_lens`` must hold the values the plan
        was made with (the work list came from them); ``debug`` checks that, and the block
        ids, by reading the device. NOTE: buffers the launcher allocated are the plan's (the
        Hopper kernel's work counter among them): run one plan on one stream at a time, and
        replay a graph captured from it only where no other run of the plan is in flight.

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
        ptr = self._ptr
        q = check_like("query", query, sq)
        ptrs = [ptr(q), ptr(check_like("key_cache", key_cache, sk)),
                ptr(check_like("value_cache", value_cache, sv)),
                ptr(check_like("block_tables", block_tables, sbt)),
                ptr(check_like("cu_seqlens_q", cu_seqlens_q, scu)),
                ptr(check_like("context_lens", context_lens, scl))]
        if (alibi_slopes is None) != (self._alibi_spec is None):
            raise ValueError("alibi_slopes must be given exactly when the plan was made with "
                             "them (the kernel's ALiBi path is chosen at plan time)")
        ptrs.append(0 if alibi_slopes is None
                    else ptr(check_like("alibi_slopes", alibi_slopes, self._alibi_spec)))
        if out is None:
            import torch

            o = torch.empty_like(q)
        else:
            o = check_like("out", out, sq)
        if self._launches:
            ptrs.append(ptr(o))
            replay(self._launches, self._templates, ptrs)
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
