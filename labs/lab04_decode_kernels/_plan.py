"""Lab 4's plan / run split (given to you, not lab content): ``plan_decode`` once per batch
shape, then ``plan.run(...)`` every step — the launch path at FlashInfer's host cost.

It is built on your TODO functions: the plan validates with your ``check_decode_args``, picks
the kernel with your ``_prefers_v6``, cuts the contexts with your ``plan_split_kv`` and groups
heads with your ``heads_per_cta``, then launches your ``.cu`` kernels exactly as your
``_split_kv_launch`` does (the tests prove ``run`` gives the one-call output bit for bit). The
lab module passes its namespace in (``plan_decode(globals(), ...)``), so a plan always uses the
functions the module holds now. Protected, like ``_launch.py``.

vLLM / FlashInfer: ``plan_decode`` is FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.plan``
(and vLLM's ``FlashInferMetadataBuilder.build``): shapes, the split-K partition plan, kernel
handle and scratch, once per step; ``run`` is the wrapper's ``run``, once per layer.
"""

from __future__ import annotations

import math

import numpy as np

from labs.lab04_decode_kernels._launch import (
    MAX_HEADS_PER_CTA,
    MAX_PARTITION_SIZE,
    NUM_THREADS,
    V3_KERNEL,
    V4_KERNEL,
    V5_KERNEL,
    V6_KERNEL,
    check_plan,
    get_kernel,
    kernel_options,
    num_sms,
)
from reference import cuda as rcuda
from reference.checks import check_on_cuda, debug_enabled
from reference.errors import UnsupportedConfigError
from reference.launch_plan import (
    FrozenPlan,
    KernelLaunch,
    check_like,
    ptr_function,
    spec_of,
)

#: The split-K kernels a plan can be made for (None: paged_attention's v6 / v4 dispatch).
PLAN_KERNELS = {"v3": V3_KERNEL, "v4": V4_KERNEL, "v5": V5_KERNEL, "v6": V6_KERNEL}


class DecodePlan(FrozenPlan):
    """One decode batch shape, planned: validated once, launched many times by :meth:`run`.

    Attributes:
        shape: the batch (a ``DecodeShape``: sizes, dtype, the scale used).
        version: the kernel it launches (``"v3"`` .. ``"v6"``).
        split: the split-K ``SplitKVPlan`` (partitions x tokens).
        max_context_len: the bound on every context the runs may have (tokens).
        heads_per_cta: query heads one CTA serves.
        debug: whether ``run`` re-runs the full, device-reading checks by default.
        lse: [num_seqs, num_q_heads] float32 scratch the kernels write the log-sum-exp into;
            ``run(..., return_lse=True)`` returns it (overwritten by the next run).
    """

    def __init__(self, ns: dict, query, key_cache, value_cache, block_tables, context_lens,
                 scale=None, *, max_context_len=None, plan=None, version=None, tuning=None,
                 debug=None):
        import torch

        if version is None:
            version = "v6" if ns["_prefers_v6"](query, key_cache) else "v4"
        if version not in PLAN_KERNELS:
            raise ValueError(f"version must be one of {sorted(PLAN_KERNELS)} or None, got "
                             f"{version!r}")
        kernel = PLAN_KERNELS[version]
        # The full check, once: structure, values (debug / CPU), then the device, last.
        shape, (q, k, v, bt, cl, _) = ns["check_decode_args"](
            query, key_cache, value_cache, block_tables, context_lens, scale,
            max_context_len=max_context_len, debug=debug, check_device=False)
        if shape.head_size not in kernel.head_sizes:
            raise UnsupportedConfigError(f"head_size={shape.head_size} is not supported by "
                                         f"{kernel.name}; it has code for {kernel.head_sizes}")
        check_plan(shape, plan, max_context_len, kernel.max_partition_size)
        defines = kernel.defines_for(tuning)
        check_on_cuda(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl)
        max_len = shape.table_tokens if max_context_len is None else int(max_context_len)
        if plan is None:
            plan = ns["plan_split_kv"](
                shape.num_seqs, shape.num_kv_heads, max_len, num_sms(q.device),
                block_size=shape.block_size, target_ctas_per_sm=kernel.target_ctas_per_sm,
                max_partition_size=kernel.max_partition_size or MAX_PARTITION_SIZE)
        hpc = ns["heads_per_cta"](shape.group, defines.pop("MAX_HEADS_PER_CTA", MAX_HEADS_PER_CTA))
        threads = 32 * defines.get("NUM_WARPS", NUM_THREADS // 32)
        defines["HEADS_PER_CTA"] = hpc
        if kernel.max_partition_size is not None:
            defines["MAX_PARTITION_SIZE"] = kernel.max_partition_size
        n = plan.num_partitions
        dev = q.device
        lse = torch.empty((shape.num_seqs, shape.num_q_heads), dtype=torch.float32, device=dev)
        part_ml = part_acc = None
        if n > 1:
            part_ml = torch.empty((2, shape.num_seqs, shape.num_q_heads, n), dtype=torch.float32,
                                  device=dev)
            part_acc = torch.empty((shape.num_seqs, shape.num_q_heads, n, shape.head_size),
                                   dtype=torch.float32, device=dev)
        launches = ()
        if shape.num_seqs:
            with _device(q):
                main = get_kernel(ns["KERNEL_DIR"] / kernel.file, kernel.name,
                                  kernel_options(shape, **defines))
                smem = kernel.shared_mem(shape, defines) if kernel.shared_mem else 0
                launches = (KernelLaunch(main, (shape.num_seqs, shape.num_q_heads // hpc, n),
                                         (threads,), smem, dev),)
                if n > 1:
                    reduce = get_kernel(ns["KERNEL_DIR"] / "decode_reduce.cu",
                                        "paged_decode_reduce", kernel_options(shape))
                    launches += (KernelLaunch(reduce, (shape.num_seqs, shape.num_q_heads), (32,),
                                              0, dev),)
        else:
            lse.fill_(-math.inf)
        ptr = ptr_function(dev)
        null = np.uint64(0)
        # Scratch pointers are fixed for the plan's life (graph replays see the same buffers).
        parts = ((ptr(part_ml[0]), ptr(part_ml[1]), ptr(part_acc)) if n > 1
                 else (null, null, null))
        self._set(
            shape=shape, version=version, split=plan, max_context_len=max_len,
            heads_per_cta=hpc, debug=debug_enabled(debug), lse=lse,
            _ns=ns, _scale=scale, _ptr=ptr, _launches=launches,
            _part_ml=part_ml, _part_acc=part_acc, _lse_ptr=ptr(lse), _parts=parts,
            _specs=(spec_of(q, 16), spec_of(k, 16), spec_of(v, 16), spec_of(bt), spec_of(cl)),
            _tail=(np.int32(shape.max_blocks_per_seq), np.int32(shape.num_kv_heads),
                   np.int32(shape.group), np.float32(shape.scale),
                   np.int32(plan.partition_size)),
            _reduce_tail=(np.int32(n), np.int32(plan.partition_size)),
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
            out_ptr, cl_ptr = ptr(o), ptr(cl)
            self._launches[0]((out_ptr, self._lse_ptr, *self._parts, ptr(q), ptr(k), ptr(v),
                               ptr(bt), cl_ptr, *self._tail))
            if len(self._launches) > 1:
                self._launches[1]((out_ptr, self._lse_ptr, *self._parts, cl_ptr,
                                   *self._reduce_tail))
        result = out if out is not None else (o if type(query) is type(o)
                                              else rcuda.like_input(o, query))
        if return_lse:
            return result, rcuda.like_input(self.lse, query)
        return result

    def __repr__(self) -> str:
        s = self.shape
        return (f"DecodePlan({self.version}, {s.num_seqs} seqs, {s.num_q_heads}q/"
                f"{s.num_kv_heads}kv, head {s.head_size}, block {s.block_size}, {s.dtype}, "
                f"split {self.split.num_partitions} x {self.split.partition_size})")


def _device(q):
    """Makes ``q``'s GPU current for CuPy while the plan loads its kernels."""
    import contextlib

    if q.device.type != "cuda":
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.Device(q.device.index or 0)


def plan_decode(ns: dict, *args, **kwargs) -> DecodePlan:
    """Makes a :class:`DecodePlan` with the lab module namespace ``ns`` (its TODO functions).

    Args:
        ns: the lab module's ``globals()``.
        *args, **kwargs: as :class:`DecodePlan`.

    Returns:
        The plan.
    """
    return DecodePlan(ns, *args, **kwargs)
