"""Lab 4's launch plumbing (given to you, not lab content): the kernels' limits, the split-K
plan and kernel descriptions, compile / launch helpers, and the two launchers given whole (the
naive baseline and v0's, whose task is the kernel, not the launcher).

Both ``starter.py`` and the solution import this file, so the two differ only in the TODOs; like
the tests, it is protected (grading reports an edit). Tuning reaches a kernel as an argument
(``tuning=`` of the split-K launchers, checked by :meth:`SplitKVKernel.defines_for`), never
through module state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labs.lab04_decode_kernels._checks import SUPPORTED_HEAD_SIZES, DecodeShape
from reference import cuda as rcuda
from reference.checks import check_int, check_on_cuda

#: This folder: the given kernel (decode_naive.cu) and header (decode_common.cuh) live here
#: once; a solution's kernels find the header through reference.cuda.kernel_include_dirs.
LAB_DIR = Path(__file__).resolve().parent

_CUDA_TYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16"}

#: Threads per CTA of v0..v4 (the naive kernel uses one thread per element instead).
NUM_THREADS = 128
#: v0 keeps one float score per token of the block table in shared memory.
V0_MAX_TOKENS = 32768
#: The GQA kernels hold at most this many query heads per CTA (registers).
MAX_HEADS_PER_CTA = 8
#: Head sizes the tensor-core kernel (v5) has code for.
V5_HEAD_SIZES = (64, 128)
#: v6: head sizes it has code for, the most query heads a CTA serves (one m16 tile), and the
#: depth of each warp's cp.async ring.
V6_HEAD_SIZES = (64, 128)
V6_MAX_HEADS_PER_CTA = 16
V6_NUM_STAGES = 3
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
class SplitKVPlan:
    """How split-K cuts every context: partition ``p`` holds tokens
    ``[p * partition_size, (p + 1) * partition_size)``.

    Attributes:
        num_partitions: partitions of the longest context (the grid's z extent).
        partition_size: tokens per partition.
    """

    num_partitions: int
    partition_size: int


def check_plan(shape: DecodeShape, plan, max_context_len, max_size: int | None) -> None:
    """Checks a caller's forced plan (None passes): it must cover the contexts in whole tiles.

    Args:
        shape: the batch.
        plan: a :class:`SplitKVPlan`, or None (the launcher plans itself).
        max_context_len: the caller's bound on the contexts, or None (the table's width).
        max_size: the longest partition the kernel stages, or None (no cap).

    Raises:
        TypeError: ``plan`` is not a SplitKVPlan, or its fields are not ints.
        ValueError: a partition size that is not a multiple of PARTITION_MULTIPLE or is too
            long, or a plan that does not cover ``max_context_len``.
    """
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


def v6_ring_bytes(shape: DecodeShape, defines: Mapping[str, int]) -> int:
    """v6's dynamic shared memory: per warp, NUM_STAGES slots of a 16-token K tile and V tile.

    Args:
        shape: the batch (its head size).
        defines: the kernel's -D options (NUM_STAGES, and NUM_WARPS when tuned).

    Returns:
        Bytes of dynamic shared memory.
    """
    num_warps = defines.get("NUM_WARPS", NUM_THREADS // 32)
    return num_warps * defines["NUM_STAGES"] * 2 * 16 * shape.head_size * 2


@dataclass(frozen=True)
class SplitKVKernel:
    """What differs between the split-K launchers v3..v6: the kernel and its limits.

    Attributes:
        file: the ``.cu`` file, in the implementation's own folder.
        name: its ``extern "C"`` kernel.
        head_sizes: head sizes it has code for (others: UnsupportedConfigError).
        max_partition_size: the longest partition it stages; caps the plan and reaches the
            kernel as ``-DMAX_PARTITION_SIZE``. None (v3): no cap of its own.
        target_ctas_per_sm: what :func:`plan_split_kv` aims for.
        defaults: -D options it always gets unless tuned (v6: MAX_HEADS_PER_CTA, NUM_STAGES).
        tunable: the -D options a call's ``tuning`` may set.
        shared_mem: ``(shape, defines) -> bytes`` of dynamic shared memory, or None.
    """

    file: str
    name: str
    head_sizes: tuple[int, ...] = SUPPORTED_HEAD_SIZES
    max_partition_size: int | None = None
    target_ctas_per_sm: int = TARGET_CTAS_PER_SM
    defaults: tuple[tuple[str, int], ...] = ()
    tunable: tuple[str, ...] = ()
    shared_mem: Callable[[DecodeShape, Mapping[str, int]], int] | None = None

    def defines_for(self, tuning: Mapping[str, int] | None) -> dict[str, int]:
        """Returns the kernel's tuning -D options for one call: its defaults, then ``tuning``.

        ``MAX_HEADS_PER_CTA`` among them caps :func:`heads_per_cta` (it is not a kernel
        option: pop it); ``NUM_WARPS`` sets the CTA's threads (32 each).

        Args:
            tuning: option name -> positive int (keys from :attr:`tunable`), or None.

        Returns:
            A new dict, which the caller may change.

        Raises:
            TypeError: ``tuning`` is not a mapping of str to int.
            ValueError: a key this kernel does not take, or a value < 1.
        """
        defines = dict(self.defaults)
        if tuning is None:
            return defines
        if not isinstance(tuning, Mapping):
            raise TypeError(f"tuning must be a dict of -D options, got {type(tuning).__name__}")
        for key, value in tuning.items():
            if key not in self.tunable:
                raise ValueError(f"tuning[{key!r}] is not an option of {self.name}; it takes "
                                 f"{self.tunable or 'none'}")
            defines[key] = check_int(f"tuning[{key!r}]", value, min_value=1)
        return defines


#: The four split-K kernels (v3's has no partition cap and no tuning knobs).
V3_KERNEL = SplitKVKernel("decode_v3.cu", "paged_decode_v3")
V4_KERNEL = SplitKVKernel("decode_v4.cu", "paged_decode_v4", max_partition_size=MAX_PARTITION_SIZE,
                          tunable=("NUM_WARPS", "VECS_PER_LANE", "MAX_HEADS_PER_CTA"))
V5_KERNEL = SplitKVKernel("decode_v5.cu", "paged_decode_v5", head_sizes=V5_HEAD_SIZES,
                          max_partition_size=MAX_PARTITION_SIZE)
V6_KERNEL = SplitKVKernel("decode_v6.cu", "paged_decode_v6", head_sizes=V6_HEAD_SIZES,
                          max_partition_size=V6_MAX_PARTITION_SIZE,
                          target_ctas_per_sm=V6_TARGET_CTAS_PER_SM,
                          defaults=(("MAX_HEADS_PER_CTA", V6_MAX_HEADS_PER_CTA),
                                    ("NUM_STAGES", V6_NUM_STAGES)),
                          tunable=("NUM_WARPS", "NUM_STAGES", "MAX_HEADS_PER_CTA"),
                          shared_mem=v6_ring_bytes)


# ----------------------------------------------------------------------------- compile, launch


def get_kernel(cu_path: Path, name: str, options: tuple[str, ...]):
    """Returns a compiled kernel (one module per file and option set, compiled once).

    Args:
        cu_path: the ``.cu`` file (``KERNEL_DIR / file`` of the implementation).
        name: the ``extern "C"`` kernel.
        options: compiler options, from :func:`kernel_options`.

    Returns:
        A ``cupy.RawKernel``.
    """
    # NOTE: the emulated device and the GPU compile different things from the same file: the
    # mode is part of the cache key (one process may run both, as the test suite does).
    return _compiled_kernel(cu_path, name, options, rcuda.emulating())


@functools.lru_cache(maxsize=None)
def _compiled_kernel(cu_path: Path, name: str, options: tuple[str, ...], emulated: bool):
    return rcuda.get_kernel(cu_path, name, options=options)


def kernel_options(shape: DecodeShape, **defines) -> tuple[str, ...]:
    """Returns the -D options of one kernel configuration (one compiled module each).

    Args:
        shape: the batch: element type, head size and block size become -D options.
        **defines: more -D options (HEADS_PER_CTA=..., a kernel's tuning).

    Returns:
        The options, sorted so that equal configurations share a module.
    """
    opts = [f"-DSCALAR_T={_CUDA_TYPE[shape.dtype]}", f"-DHEAD_SIZE={shape.head_size}",
            f"-DBLOCK_SIZE={shape.block_size}"]
    return tuple(opts + [f"-D{k}={v}" for k, v in sorted(defines.items())])


@functools.lru_cache(maxsize=None)
def num_sms(device) -> int:
    """Returns the streaming multiprocessors of a device (a torch.device or a CUDA index): the
    emulated device's fixed count for the CPU under ``PAGEDLAB_DEVICE=emulate``."""
    return rcuda.num_sms(device)


def new_out(q, out):
    """Returns ``out``, or a new tensor like ``q`` when it is None (every element is written)."""
    import torch

    return out if out is not None else torch.empty_like(q)


def finish(result, query):
    """Returns a torch result as the caller's kind: a CuPy array if ``query`` was one."""
    return rcuda.like_input(result, query)


def table_args(shape: DecodeShape):
    """Returns the block-table width and KV head count, the kernels' first two scalars."""
    return np.int32(shape.max_blocks_per_seq), np.int32(shape.num_kv_heads)


def launch_naive(shape: DecodeShape, tensors, query):
    """Launches the seed's per-(token, head) kernel, decode_naive.cu (kept once, here).

    Args:
        shape: from ``check_decode_args``.
        tensors: ``(q, k, v, bt, cl, out)`` from ``check_decode_args`` (out may be None).
        query: the caller's query (its kind decides the result's).

    Returns:
        [num_seqs, num_q_heads, head_size], the caller's kind.
    """
    q, k, v, bt, cl, out = tensors
    out = new_out(q, out)
    if shape.num_seqs:
        kernel = get_kernel(LAB_DIR / "decode_naive.cu", "paged_decode_naive", kernel_options(shape))
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads), (shape.head_size,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *table_args(shape), np.float32(shape.scale)))
    return finish(out, query)


def launch_v0(cu_path: Path, shape: DecodeShape, tensors, query):
    """Checks v0's own limit, then the device, then launches decode_v0.cu's two-pass kernel.

    Args:
        cu_path: the implementation's decode_v0.cu.
        shape: from ``check_decode_args(..., check_device=False)``.
        tensors: ``(q, k, v, bt, cl, out)`` from the same call.
        query: the caller's query (its kind decides the result's).

    Returns:
        [num_seqs, num_q_heads, head_size], the caller's kind.

    Raises:
        ValueError: the block table addresses more than V0_MAX_TOKENS tokens.
        DeviceMismatchError: not every tensor on one CUDA device.
    """
    q, k, v, bt, cl, out = tensors
    if shape.table_tokens > V0_MAX_TOKENS:
        raise ValueError(f"block_tables addresses {shape.table_tokens} tokens per sequence; v0 "
                         f"keeps one score per token in shared memory and allows {V0_MAX_TOKENS}")
    check_on_cuda(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl, out=out)
    out = new_out(q, out)
    if shape.num_seqs:
        kernel = get_kernel(cu_path, "paged_decode_v0", kernel_options(shape))
        smem = 4 * (shape.head_size + NUM_THREADS // 32 + shape.table_tokens)
        rcuda.launch(kernel, (shape.num_seqs, shape.num_q_heads), (NUM_THREADS,),
                     (rcuda.ptr(out), rcuda.ptr(q), rcuda.ptr(k), rcuda.ptr(v), rcuda.ptr(bt),
                      rcuda.ptr(cl), *table_args(shape), np.float32(shape.scale)), shared_mem=smem)
    return finish(out, query)
