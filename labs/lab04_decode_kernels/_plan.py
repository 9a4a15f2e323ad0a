"""Lab 4's plan / run split (given to you, not lab content): ``plan_decode`` once per batch
shape, then ``plan.run(...)`` every step — the launch path at FlashInfer's host cost.

It is built on your TODO functions: the plan picks the kernel with your ``_prefers_v6``,
validates with your ``check_decode_args``, then calls your ``_split_kv_launch`` once with its
launches *recorded* instead of run (``reference.launch_plan.record_launches``): your launcher
plans the split, allocates its scratch and chooses kernels, grids and shared memory, and the
plan keeps exactly that. ``run`` re-launches it with the run's tensors in place of the
example's (the tests prove it gives the one-call output bit for bit). So launch with
``launch(...)`` and pass ``ptr(<the input>)``, as the TODOs say. The lab module passes its
namespace in (``plan_decode(globals(), ...)``), so a plan always uses the functions the module
holds now. Protected, like ``_launch.py``.

vLLM / FlashInfer: ``plan_decode`` is FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.plan``
(and vLLM's ``FlashInferMetadataBuilder.build``): shapes, the split-K partition plan, kernel
handle and scratch, once per step; ``run`` is the wrapper's ``run``, once per layer.
"""

from __future__ import annotations

from labs.lab04_decode_kernels._launch import (
    V3_KERNEL,
    V4_KERNEL,
    V5_KERNEL,
    V6_KERNEL,
)
from reference import cuda as rcuda
from reference.checks import debug_enabled
from reference.launch_plan import (
    FrozenPlan,
    check_like,
    no_launcher_launch,
    ptr_function,
    record_launches,
    replay,
    spec_of,
)

#: The split-K kernels a plan can be made for (None: paged_attention's v6 / v4 dispatch).
PLAN_KERNELS = {"v3": V3_KERNEL, "v4": V4_KERNEL, "v5": V5_KERNEL, "v6": V6_KERNEL}

#: The run's tensors, in the order their pointers are re-pointed.
_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "context_lens", "out")


class DecodePlan(FrozenPlan):
    """One decode batch shape, planned: validated once, launched many times by :meth:`run`.

    Attributes:
        shape: the batch (a ``DecodeShape``: sizes, dtype, the scale used).
        version: the kernel it launches (``"v3"`` .. ``"v6"``).
        num_partitions: split-K partitions your launcher chose (the grid's z extent).
        max_context_len: the bound on every context the runs may have (tokens).
        heads_per_cta: query heads one CTA serves (None for an empty batch).
        debug: whether ``run`` re-runs the full, device-reading checks by default.
        lse: [num_seqs, num_q_heads] float32 scratch the kernels write the log-sum-exp into;
            ``run(..., return_lse=True)`` returns it (overwritten by the next run).
    """

    def __init__(self, ns: dict, query, key_cache, value_cache, block_tables, context_lens,
                 scale=None, *, max_context_len=None, plan=None, version=None, tuning=None,
                 debug=None):
        import torch

        if version is None:
            use_v6 = ns["_prefers_v6"](query, key_cache) and rcuda.runs_sm80_stages(query)
            version = "v6" if use_v6 else "v4"
        if version not in PLAN_KERNELS:
            raise ValueError(f"version must be one of {sorted(PLAN_KERNELS)} or None, got "
                             f"{version!r}")
        kernel = PLAN_KERNELS[version]
        shape, (q, k, v, bt, cl, _) = ns["check_decode_args"](
            query, key_cache, value_cache, block_tables, context_lens, scale,
            max_context_len=max_context_len, debug=debug, check_device=False)
        example_out = torch.empty_like(q)

        def launch_once(q, k, v, bt, cl, out):
            return ns["_split_kv_launch"](kernel, q, k, v, bt, cl, scale,
                                          max_context_len=max_context_len, plan=plan,
                                          return_lse=True, out=out, debug=debug, tuning=tuning)

        who = f"plan_decode ({version}: your _split_kv_launch)"
        (_, lse), launches, templates, kept = record_launches(
            who, launch_once, _INPUTS, (q, k, v, bt, cl, example_out), _INPUTS, q.device)
        if shape.num_seqs and not launches:
            raise no_launcher_launch(who)
        grid = launches[0].grid + (1, 1) if launches else (0, 1, 1)
        self._set(
            shape=shape, version=version, num_partitions=grid[2],
            max_context_len=shape.table_tokens if max_context_len is None
            else int(max_context_len),
            heads_per_cta=shape.num_q_heads // grid[1] if launches else None,
            debug=debug_enabled(debug), lse=rcuda.as_torch(lse),
            _ns=ns, _scale=scale, _ptr=ptr_function(q.device), _launches=launches,
            _templates=templates, _kept=kept,
            _specs=(spec_of(q, 16), spec_of(k, 16), spec_of(v, 16), spec_of(bt), spec_of(cl)),
        )

    def run(self, query, key_cache, value_cache, block_tables, context_lens, *, out=None,
            return_lse=False, debug=None):
        """Launches the planned kernels on the current torch stream.

        Checks only what a call can change cheaply (each tensor's shape, dtype, device,
        contiguity and alignment against the plan: attribute reads, no device memory read, no
        synchronisation), so it can be captured in a CUDA graph; with ``out`` given it
        allocates nothing. It trusts ``context_lens <= max_context_len`` and the block ids:
        ``debug`` re-runs the full checks, reading the device.

        Args:
            query: [num_seqs, num_q_heads, head_size], as planned.
            key_cache: [num_blocks, num_kv_heads, block_size, head_size], as planned.
            value_cache: [num_blocks, num_kv_heads, block_size, head_size], as planned.
            block_tables: [num_seqs, max_blocks_per_seq] int32, as planned.
            context_lens: [num_seqs] int32, each at most the plan's ``max_context_len``.
            out: [num_seqs, num_q_heads, head_size] like ``query`` to write into, or None to
                allocate a new one.
            return_lse: also return the plan's ``lse`` buffer (overwritten by the next run).
            debug: re-run the full checks (device reads) first; None: the plan's ``debug``.

        Returns:
            The output (the caller's kind), or ``(output, lse)`` with ``return_lse``.

        Raises:
            TypeError: not a tensor, or another dtype than planned.
            ValueError: another shape than planned, non-contiguous or misaligned.
            DeviceMismatchError: another device than planned.
        """
        if debug or (debug is None and self.debug):
            self._ns["check_decode_args"](query, key_cache, value_cache, block_tables,
                                          context_lens, self._scale, out=out,
                                          max_context_len=self.max_context_len, debug=True)
        sq, sk, sv, sbt, scl = self._specs
        q = check_like("query", query, sq)
        k = check_like("key_cache", key_cache, sk)
        v = check_like("value_cache", value_cache, sv)
        bt = check_like("block_tables", block_tables, sbt)
        cl = check_like("context_lens", context_lens, scl)
        if out is None:
            import torch

            o = torch.empty_like(q)
        else:
            o = check_like("out", out, sq)
        if self._launches:
            ptr = self._ptr
            replay(self._launches, self._templates,
                   (ptr(q), ptr(k), ptr(v), ptr(bt), ptr(cl), ptr(o)))
        result = out if out is not None else (o if type(query) is type(o)
                                              else rcuda.like_input(o, query))
        if return_lse:
            return result, rcuda.like_input(self.lse, query)
        return result

    def __repr__(self) -> str:
        s = self.shape
        return (f"DecodePlan({self.version}, {s.num_seqs} seqs, {s.num_q_heads}q/"
                f"{s.num_kv_heads}kv, head {s.head_size}, block {s.block_size}, {s.dtype}, "
                f"{self.num_partitions} partitions)")


def plan_decode(ns: dict, *args, **kwargs) -> DecodePlan:
    """Makes a :class:`DecodePlan` with the lab module namespace ``ns`` (its TODO functions).

    Args:
        ns: the lab module's ``globals()``.
        *args, **kwargs: as :class:`DecodePlan`.

    Returns:
        The plan.
    """
    return DecodePlan(ns, *args, **kwargs)
