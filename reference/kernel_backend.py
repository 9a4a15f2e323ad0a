"""``attention_backend="kernels"``: the paged Llama's attention on Lab 4's and Lab 5's kernels.

One engine step can mix sequences that decode (one new token) with sequences that prefill a
prompt or a chunk of one (several new tokens after a history). This module splits the step once,
before the first layer, and then every layer runs

    decode rows   -> Lab 4's ``paged_attention`` (v6 or v4, the lab's production entry point)
    prefill rows  -> Lab 5's ``paged_prefill_wgmma`` on a Hopper GPU where Task 5.6 is done,
                     else ``paged_prefill_tc`` (tensor cores; causal with history)

over the same ``[num_blocks, num_kv_heads, block_size, head_size]`` pool the model wrote K/V
into, and scatters both outputs back into the step's packed order. The plans (Lab 5's query
tiles, Lab 4's split-K) are made once per step from host copies of the metadata, so a layer
reads nothing back from the GPU.

Which implementation of Labs 4–5 runs is the one the loader picks (``reference/loader.py``):
``LAB_IMPL=starter`` (a student release) runs the student's kernels, an instructor's checkout
the solutions. Unfinished labs are found before anything is served: :func:`probe` calls both
launchers on a tiny batch, and a ``NotImplementedError("TODO(lab4.k): ...")`` there becomes a
:class:`KernelLabsUnfinishedError` naming the TODO and the lab to finish.

Where kernels run: on a CUDA GPU, or on the CPU under ``PAGEDLAB_DEVICE=emulate``
(``reference/emulate.py`` compiles the same ``.cu`` files with g++). The kernels take float16
and bfloat16 only; a float32/float64 model stays on the oracle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

LAB4 = "lab04_decode_kernels"
LAB5 = "lab05_prefill_kernels"
#: The dtypes both labs' production kernels have code for.
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
#: Sizes both labs support (Lab 4: head 64/128/256, block 8/16/32; Lab 5: head 64/128,
#: block 8..128).
KERNEL_HEAD_SIZES = (64, 128)
KERNEL_BLOCK_SIZES = (8, 16, 32)


class BackendUnavailableError(RuntimeError):
    """The chosen attention backend cannot run on this machine (e.g. ``kernels`` without a GPU)."""


class KernelLabsUnfinishedError(BackendUnavailableError, NotImplementedError):
    """Lab 4's or Lab 5's implementation in use still raises a ``TODO(labN.k)``."""


def kernel_device_type() -> str:
    """The torch device type the kernels read: ``"cpu"`` under emulation, else ``"cuda"``."""
    from reference.emulate import emulating

    return "cpu" if emulating() else "cuda"


def kernel_labs():
    """Imports the implementations of Labs 4 and 5 the loader picks.

    NOTE: ``impl_name()`` is passed explicitly so that ``PAGEDLAB_IMPL_DIR`` (a *Lab 6* mutant
    under test) is never mistaken for Lab 4's or Lab 5's code.

    Returns:
        ``(lab4_module, lab5_module)``.
    """
    from reference.loader import impl_name, load_impl

    impl = impl_name()
    return load_impl(LAB4, impl), load_impl(LAB5, impl)


def check_kernel_model(like: torch.Tensor) -> None:
    """Checks that a model whose weights look like ``like`` can run on the kernels, then probes
    Labs 4–5 (:func:`probe`).

    Args:
        like: a weight tensor (its dtype and device decide).

    Raises:
        BackendUnavailableError: a dtype the kernels lack, no CUDA GPU (and no emulation), or
            weights on another device than the kernels read.
        KernelLabsUnfinishedError: Lab 4's or Lab 5's implementation raises a TODO.
    """
    if like.dtype not in KERNEL_DTYPES:
        raise BackendUnavailableError(
            f"attention_backend='kernels' runs Lab 4's and Lab 5's float16/bfloat16 kernels; this "
            f"model is {str(like.dtype).removeprefix('torch.')}. Load it with "
            f"PagedLlama.from_hf(..., dtype=torch.float16) or keep attention_backend='oracle' "
            f"(float32/float64 models stay on the oracle).")
    want = kernel_device_type()
    if want == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(
            "attention_backend='kernels' runs Lab 4's decode and Lab 5's prefill CUDA kernels and "
            "needs a CUDA GPU with the model on it (device='cuda'); this machine has none. Use "
            "attention_backend='oracle', or PAGEDLAB_DEVICE=emulate to run the kernels' .cu "
            "files on the CPU (slow: tiny models only).")
    if like.device.type != want:
        where = "the emulated device reads CPU tensors (device='cpu')" if want == "cpu" else \
            "the kernels need the model on the GPU (device='cuda')"
        raise BackendUnavailableError(
            f"attention_backend='kernels': the model's weights are on {like.device}, but {where}.")
    probe(like.dtype, str(like.device))


@functools.lru_cache(maxsize=None)
def _probe_cached(impl_key: tuple, dtype: torch.dtype, device: str, emulated: bool) -> str:
    lab4, lab5 = kernel_labs()
    gen = torch.Generator().manual_seed(0)
    # NOTE: one sequence, head size 64, block 16: the smallest batch both labs accept, so the
    # probe costs one compile per kernel (cached on disk by the emulator and by CuPy).
    k = torch.randn(2, 1, 16, 64, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(2, 1, 16, 64, generator=gen).to(dtype=dtype, device=device)
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=device)
    lens = torch.tensor([20], dtype=torch.int32, device=device)
    q1 = torch.randn(1, 2, 64, generator=gen).to(dtype=dtype, device=device)
    q4 = torch.randn(4, 2, 64, generator=gen).to(dtype=dtype, device=device)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
    prefill_args = (q4, k, v, table, cu, lens, 0.125)
    calls = ((LAB4, lambda: lab4.paged_attention(q1, k, v, table, lens, 0.125)),
             (LAB5, lambda: lab5.paged_prefill_tc(*prefill_args)))
    for lab, call in calls:
        try:
            out = call()
        except NotImplementedError as exc:
            name = "paged_attention" if lab == LAB4 else "paged_prefill_tc"
            raise KernelLabsUnfinishedError(
                f"attention_backend='kernels' serves with {lab}'s {name} ({impl_key[0]}: "
                f"{impl_key[1 if lab == LAB4 else 2]}), which is unfinished: {exc}. Finish that "
                f"lab (LAB_IMPL={impl_key[0]} pagedlab grade {lab[4]} lists what is left) or use "
                f"attention_backend='oracle'.") from exc
    return _prefill_kernel(lab5, prefill_args, out, emulated)


def _prefill_kernel(lab5, args: tuple, want: torch.Tensor, emulated: bool) -> str:
    """``"wgmma"`` where Lab 5's Hopper stage runs on the probe batch ``args`` and agrees with
    its tensor-core stage's output there (``want``), else ``"tc"``.

    NOTE: Task 5.6 is optional and Hopper-only: an unfinished or failing Hopper stage is not an
    error here; the backend then serves prefill on ``paged_prefill_tc``, as on other GPUs.
    """
    if emulated or torch.cuda.get_device_capability(want.device) != (9, 0):
        return "tc"
    try:
        got = lab5.paged_prefill_wgmma(*args)
    except (NotImplementedError, ValueError, RuntimeError):
        return "tc"
    return "wgmma" if torch.allclose(got.float(), want.float(), atol=2e-2, rtol=0) else "tc"


def probe(dtype: torch.dtype, device: str) -> str:
    """Runs Lab 4's decode and Lab 5's prefill launcher once on a tiny batch (once per process,
    implementation, dtype and device), so an unfinished lab is reported before a step runs; on a
    Hopper GPU also Lab 5's ``paged_prefill_wgmma``, to pick the prefill kernel.

    Args:
        dtype: float16 or bfloat16.
        device: ``"cuda:N"``, or ``"cpu"`` under emulation.

    Returns:
        The prefill kernel to serve with: ``"wgmma"`` or ``"tc"``.

    Raises:
        KernelLabsUnfinishedError: a launcher raised ``NotImplementedError`` (a TODO).
    """
    from reference.emulate import emulating
    from reference.loader import impl_file, impl_name

    impl = impl_name()
    key = (impl, str(impl_file(LAB4, impl)), str(impl_file(LAB5, impl)))
    return _probe_cached(key, dtype, device, emulating())


@dataclass
class _Part:
    """The sequences of one kind (decode or prefill) in a step, as the kernels want them.

    ``token_idx`` is None when the part is the whole step (no gather, no scatter).
    """

    token_idx: torch.Tensor | None   # [num_part_tokens] int64 rows of the packed query
    block_tables: torch.Tensor       # [num_part_seqs, max_blocks] int32
    context_lens: torch.Tensor       # [num_part_seqs] int32
    cu_seqlens_q: torch.Tensor | None  # [num_part_seqs + 1] int32 (prefill only)
    max_context_len: int
    plan: object = None              # Lab 5's TilePlan (prefill only; made at the first layer)
    kernel: str = "tc"               # Lab 5's prefill stage: "tc" or "wgmma" (see probe)


class KernelStep:
    """One step's split into decode and prefill sequences, shared by every layer."""

    def __init__(self, inputs, num_q_heads: int, num_kv_heads: int) -> None:
        """Splits the step (reads ``query_start_loc`` and ``context_lens`` to the host once).

        Args:
            inputs: the step's ``reference.llama.StepInputs`` (tensors on the kernels' device).
            num_q_heads: query heads.
            num_kv_heads: KV heads.
        """
        self.lab4, self.lab5 = kernel_labs()
        starts = inputs.query_start_loc.tolist()
        q_lens = [b - a for a, b in zip(starts, starts[1:])]
        ctx = inputs.context_lens.tolist()
        device = inputs.block_tables.device
        decode = [i for i, n in enumerate(q_lens) if n == 1]
        prefill = [i for i, n in enumerate(q_lens) if n > 1]
        self.num_tokens = starts[-1]
        self.decode = self._part(inputs, decode, starts, ctx, device, whole=len(decode) == len(q_lens))
        self.prefill = self._part(inputs, prefill, starts, ctx, device,
                                  whole=len(prefill) == len(q_lens))
        if self.prefill is not None:
            p = self.prefill
            q_host = [0] + list(torch.tensor([q_lens[i] for i in prefill]).cumsum(0).tolist())
            p.cu_seqlens_q = torch.tensor(q_host, dtype=torch.int32, device=device)
            # Host copies for the plan, made once per step at the first layer (which knows the
            # dtype the prefill kernel is picked for); every layer reuses it (nothing read back).
            self._plan_for = functools.partial(
                self.lab5.plan_for_kernel, cu_seqlens_q=torch.tensor(q_host, dtype=torch.int32),
                context_lens=torch.tensor([ctx[i] for i in prefill], dtype=torch.int32),
                num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)

    @staticmethod
    def _part(inputs, seqs: list[int], starts, ctx, device, whole: bool) -> _Part | None:
        if not seqs:
            return None
        max_len = max(ctx[i] for i in seqs)
        if whole:
            return _Part(None, inputs.block_tables, inputs.context_lens, None, max_len)
        rows = torch.tensor(seqs, dtype=torch.long, device=device)
        tokens = [t for i in seqs for t in range(starts[i], starts[i + 1])]
        return _Part(torch.tensor(tokens, dtype=torch.long, device=device),
                     inputs.block_tables.index_select(0, rows).contiguous(),
                     inputs.context_lens.index_select(0, rows).contiguous(), None, max_len)

    def attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  scale: float) -> torch.Tensor:
        """Paged attention of every new token (causal with its sequence's history).

        Args:
            query: [num_tokens, num_heads, head_size] packed like the step's ``input_ids``.
            key_cache: [num_blocks, num_kv_heads, block_size, head_size]
            value_cache: [num_blocks, num_kv_heads, block_size, head_size]
            scale: multiplies q·k.

        Returns:
            [num_tokens, num_heads, head_size]
        """
        parts = [(p, run) for p, run in ((self.decode, self._decode),
                                         (self.prefill, self._prefill)) if p is not None]
        if len(parts) == 1 and parts[0][0].token_idx is None:  # a pure decode or prefill step
            return parts[0][1](parts[0][0], query.contiguous(), key_cache, value_cache, scale)
        # NOTE: zeros, not empty: a sequence with no new token (none today) must not read garbage.
        out = torch.zeros_like(query)
        for part, run in parts:
            q = query.index_select(0, part.token_idx)  # a fresh, contiguous, aligned tensor
            out.index_copy_(0, part.token_idx, run(part, q, key_cache, value_cache, scale))
        return out

    def _decode(self, part: _Part, q, key_cache, value_cache, scale):
        return self.lab4.paged_attention(q, key_cache, value_cache, part.block_tables,
                                         part.context_lens, scale,
                                         max_context_len=part.max_context_len)

    def _prefill(self, part: _Part, q, key_cache, value_cache, scale):
        if part.plan is None:
            part.kernel = probe(q.dtype, str(q.device))
            part.plan = self._plan_for(part.kernel)
        launcher = getattr(self.lab5, f"paged_prefill_{part.kernel}")
        return launcher(q, key_cache, value_cache, part.block_tables, part.cu_seqlens_q,
                        part.context_lens, scale, plan=part.plan)
