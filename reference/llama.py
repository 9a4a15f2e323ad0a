"""A small Llama-architecture decoder whose attention reads and writes a paged KV cache.

Lab 6 serves this model. It is trusted plumbing, not lab content: the student writes the engine
around it (scheduler, block tables, slot mappings, prefix cache, step loop) and this module runs
the layers. Each layer

  1. projects the step's new tokens to q, k, v and rotates q and k by their *positions* (RoPE),
  2. writes k and v into the pool at ``slot_mapping`` (vLLM's ``reshape_and_cache``),
  3. attends each sequence's queries to every key its ``block_tables`` row lists, causally with
     history (``reference/oracle.py``'s semantics): in torch (``attention_backend="oracle"``),
     or on Lab 4's decode and Lab 5's prefill kernels (``"kernels"``, float16/bfloat16, see
     ``reference/kernel_backend.py``).

So the positions, slots and tables the engine hands in decide everything: a wrong one gives
wrong tokens, which is what Lab 6's tests compare against Hugging Face ``transformers``.

Weights come from a ``transformers`` ``LlamaForCausalLM`` — built from a small ``LlamaConfig``
with a fixed seed (no download), or loaded from a local checkpoint folder (safetensors).

NOTE: Hugging Face's Llama computes RMSNorm, the RoPE angles and the attention softmax in
float32 even when the model is float64. This module does the same, so in float64 both models agree to ~1e-12 and greedy
tokens are identical (a tie closer than that would be needed to flip one).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch

from reference.kernel_backend import (  # noqa: F401  (re-exported: the engine and tests use them)
    BackendUnavailableError,
    KernelLabsUnfinishedError,
    KernelStep,
    check_kernel_model,
)
from reference.layout import PAD_BLOCK_ID

#: Backends the model's attention can run on: the torch oracle (CPU or GPU) or Labs 4–5's
#: kernels (``reference/kernel_backend.py``: a GPU, or the CPU under PAGEDLAB_DEVICE=emulate).
ATTENTION_BACKENDS = ("oracle", "kernels")

#: The tiny shape Lab 6's tests use: a whole generate runs in milliseconds on one CPU core.
TINY_LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)

#: The smallest shape the kernels take (head size 64: Labs 4-5 have no code for 16), GQA group
#: 2, for the kernel backend's tests: an emulated generate runs in seconds.
TINY_KERNEL_LLAMA = dict(vocab_size=256, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024)


@dataclass
class StepInputs:
    """Everything one engine step hands the model; built by the engine (Lab 6's ``prepare_inputs``).

    The step's new tokens of every scheduled sequence are packed back to back, in schedule order.

    Attributes:
        input_ids: [num_tokens] int64 token ids of the new tokens.
        positions: [num_tokens] int64 position of each token in its sequence (RoPE reads these).
        slot_mapping: [num_tokens] int64 ``block_id * block_size + offset`` where each new token's
            K/V is written.
        block_tables: [num_seqs, max_blocks] int32 each sequence's blocks, padded with
            ``PAD_BLOCK_ID``.
        context_lens: [num_seqs] int32 tokens each sequence attends to after this step
            (history + new).
        query_start_loc: [num_seqs + 1] int64 offsets of each sequence's new tokens.
        logits_indices: [num_seqs] int64 index of each sequence's last new token.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor


def _step_fields(inputs) -> list:
    """The fields of a :class:`StepInputs` (or of a look-alike), in order."""
    return [getattr(inputs, f.name) for f in fields(StepInputs)]


@dataclass(frozen=True)
class LlamaShape:
    """The sizes of a Llama decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    rope_theta: float
    rms_norm_eps: float


def make_tiny_hf_llama(seed: int = 0, dtype: torch.dtype = torch.float64, device: str = "cpu",
                       **overrides):
    """Builds a randomly initialised ``transformers`` ``LlamaForCausalLM`` (no download).

    Args:
        seed: torch seed for the initial weights (same seed, same weights, on every machine of
            the same device type).
        dtype: parameter dtype.
        device: where the weights are made (a 1B-class shape is made on the GPU directly:
            initialising a billion parameters on the CPU takes a minute).
        **overrides: ``LlamaConfig`` fields replacing :data:`TINY_LLAMA`'s (and
            ``attn_implementation``, ``"eager"`` by default).

    Returns:
        The model in eval mode.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    # NOTE: eager attention unless overridden: its float32 softmax is what the paged model matches.
    config = LlamaConfig(**{"attn_implementation": "eager", **TINY_LLAMA, **overrides},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    device = torch.device(device)
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        with device:
            model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


@torch.no_grad()
def hf_greedy_generate(hf_model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens from ``transformers``' own ``generate`` (its own dense KV cache), one prompt
    at a time so no padding can change a number.

    Args:
        hf_model: a ``LlamaForCausalLM``.
        prompts: token ids per prompt.
        max_tokens: tokens to generate per prompt (no EOS stops it).

    Returns:
        The generated token ids per prompt.
    """
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=hf_model.device)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                eos_token_id=None, pad_token_id=0)
        outputs.append(out[0, len(prompt):].tolist())
    return outputs


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = config.rope_parameters["rope_theta"]
    return float(theta)


class PagedLlama:
    """A Llama decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) over a paged KV cache."""

    def __init__(self, shape: LlamaShape, weights: dict[str, torch.Tensor],
                 attention_backend: str = "oracle") -> None:
        """Wraps weights named as in Hugging Face's ``LlamaForCausalLM`` state dict.

        Args:
            shape: the model's sizes.
            weights: parameter tensors, all of one dtype and device.
            attention_backend: ``"oracle"`` (torch, any device, any dtype) or ``"kernels"``
                (Labs 4–5: float16/bfloat16 weights on a GPU, or on the CPU under emulation).

        Raises:
            ValueError: unknown ``attention_backend``.
            BackendUnavailableError: ``"kernels"`` where they cannot run (see
                :func:`check_attention_backend`).
            KernelLabsUnfinishedError: ``"kernels"`` while Lab 4 or 5 still raises a TODO.
        """
        self.shape = shape
        self.weights = weights
        self.attention_backend = check_attention_backend(attention_backend, weights["lm_head.weight"])
        self.dtype = weights["lm_head.weight"].dtype
        self.device = weights["lm_head.weight"].device
        half = torch.arange(0, shape.head_size, 2, dtype=torch.float32)
        # NOTE: float32 like Hugging Face (see the module docstring).
        self._inv_freq = (1.0 / (shape.rope_theta ** (half / shape.head_size))).to(self.device)

    @classmethod
    def from_hf(cls, source, dtype: torch.dtype = torch.float64, device: str = "cpu",
                attention_backend: str = "oracle") -> "PagedLlama":
        """Loads weights from a ``LlamaForCausalLM`` or a local Hugging Face checkpoint folder.

        Args:
            source: a ``LlamaForCausalLM`` instance, or a path to a folder with ``config.json``
                and ``*.safetensors`` (read with ``local_files_only``: nothing is downloaded).
            dtype: dtype of the weights, activations and KV cache.
            device: where the weights live.
            attention_backend: see :meth:`__init__`.

        Returns:
            The model.
        """
        if isinstance(source, (str, Path)):
            from transformers import LlamaForCausalLM

            source = LlamaForCausalLM.from_pretrained(str(source), local_files_only=True)
        config = source.config
        num_heads = config.num_attention_heads
        shape = LlamaShape(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size, num_layers=config.num_hidden_layers,
            num_heads=num_heads, num_kv_heads=config.num_key_value_heads,
            head_size=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            rope_theta=_rope_theta(config), rms_norm_eps=float(config.rms_norm_eps),
        )
        state = {k: v.detach().to(device=device, dtype=dtype).clone()
                 for k, v in source.state_dict().items()}
        if "lm_head.weight" not in state:  # tied embeddings
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return cls(shape, state, attention_backend)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Allocates one (key_cache, value_cache) pair per layer, sharing block ids.

        Args:
            num_blocks: blocks per layer.
            block_size: tokens per block.

        Returns:
            Per layer, two zeroed tensors
            ``[num_blocks, num_kv_heads, block_size, head_size]`` (the workbook layout).
        """
        s = self.shape
        size = (num_blocks, s.num_kv_heads, block_size, s.head_size)
        return [(torch.zeros(size, dtype=self.dtype, device=self.device),
                 torch.zeros(size, dtype=self.dtype, device=self.device))
                for _ in range(s.num_layers)]

    @torch.no_grad()
    def forward(self, inputs: StepInputs, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Runs one engine step: writes the new tokens' K/V and returns each sequence's logits.

        Args:
            inputs: the step's packed tokens and paging metadata.
            kv_caches: from :meth:`allocate_kv_cache`.

        Returns:
            [num_seqs, vocab_size] logits at each sequence's last new token.
        """
        if type(inputs) is not StepInputs:
            # NOTE: every field read once, here, in one go: graded isolated, the engine's inputs
            # live in the student's process, where each read is a round trip and a tensor copy,
            # and every layer reads several of them.
            from reference.grader.proxy import gather

            inputs = StepInputs(*gather(_step_fields, inputs))
        kernel_step = None
        if self.attention_backend == "kernels":
            # Split into decode and prefill sequences once; every layer reuses the split.
            kernel_step = KernelStep(inputs, self.shape.num_heads, self.shape.num_kv_heads)
        return self._forward(inputs, kv_caches, kernel_step)

    def _forward(self, inputs: StepInputs, kv_caches, kernel_step: KernelStep | None) -> torch.Tensor:
        w = self.weights
        h = w["model.embed_tokens.weight"][inputs.input_ids.to(self.device)]
        cos, sin = self._rope(inputs.positions.to(self.device))
        for layer, (key_cache, value_cache) in enumerate(kv_caches):
            p = f"model.layers.{layer}."
            x = self._rms_norm(h, w[p + "input_layernorm.weight"])
            h = h + self._attention(x, p, cos, sin, inputs, key_cache, value_cache, kernel_step)
            x = self._rms_norm(h, w[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
            h = h + (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        h = self._rms_norm(h[inputs.logits_indices.to(self.device)], w["model.norm.weight"])
        return h @ w["lm_head.weight"].T

    @torch.no_grad()
    def dense_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits of every position of one sequence, computed densely through a fresh cache.

        Always on the oracle attention, whatever ``attention_backend`` is: this is the reference
        the kernels' step logits are compared with.

        Args:
            token_ids: the sequence.

        Returns:
            [len(token_ids), vocab_size] logits (position ``i`` predicts token ``i + 1``).
        """
        n = len(token_ids)
        caches = self.allocate_kv_cache(1, n)
        inputs = StepInputs(
            input_ids=torch.tensor(token_ids, dtype=torch.long),
            positions=torch.arange(n), slot_mapping=torch.arange(n),
            block_tables=torch.zeros((1, 1), dtype=torch.int32),
            context_lens=torch.tensor([n], dtype=torch.int32),
            query_start_loc=torch.tensor([0, n]), logits_indices=torch.arange(n))
        # NOTE: logits_indices lists every token, not just the last, to get every position's logits.
        return self._forward(inputs, caches, None)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.shape.rms_norm_eps)
        return weight * x32.to(x.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].to(torch.float32) * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [num_tokens, head_size]
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _attention(self, x, prefix, cos, sin, inputs, key_cache, value_cache, kernel_step):
        s, w = self.shape, self.weights
        n = x.shape[0]
        q = (x @ w[prefix + "self_attn.q_proj.weight"].T).view(n, s.num_heads, s.head_size)
        k = (x @ w[prefix + "self_attn.k_proj.weight"].T).view(n, s.num_kv_heads, s.head_size)
        v = (x @ w[prefix + "self_attn.v_proj.weight"].T).view(n, s.num_kv_heads, s.head_size)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        write_kv(key_cache, value_cache, k, v, inputs.slot_mapping.to(self.device))
        if kernel_step is None:
            out = paged_attention_torch(q, key_cache, value_cache, inputs, s.head_size ** -0.5)
        else:
            out = kernel_step.attention(q, key_cache, value_cache, s.head_size ** -0.5)
        return out.reshape(n, -1) @ w[prefix + "self_attn.o_proj.weight"].T


def check_attention_backend(name: object, like: torch.Tensor) -> str:
    """Validates an ``attention_backend`` choice for weights living where ``like`` lives.

    ``"kernels"`` runs the Labs 4–5 implementation the loader picks (``LAB_IMPL``): a student's
    own kernels in a release, the solutions in an instructor's checkout. It needs float16 or
    bfloat16 weights on a CUDA GPU, or on the CPU under ``PAGEDLAB_DEVICE=emulate``; both labs'
    launchers are probed once here, so an unfinished lab is named now, not in the middle of a
    step.

    Args:
        name: ``"oracle"`` or ``"kernels"``.
        like: a weight tensor (its dtype and device decide whether kernels can run).

    Returns:
        ``name``.

    Raises:
        ValueError: ``name`` is not a known backend.
        BackendUnavailableError: ``"kernels"`` with float32/float64 weights, without a CUDA GPU
            (and no emulation), or with the weights elsewhere than the kernels read.
        KernelLabsUnfinishedError: ``"kernels"`` while Lab 4's ``paged_attention`` or Lab 5's
            ``paged_prefill_tc`` raises ``NotImplementedError("TODO(labN.k): ...")``; the
            message names the TODO.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "kernels":
        check_kernel_model(like)
    return name


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatters new K/V into the pool at their slots (vLLM's ``reshape_and_cache``).

    Args:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        key: [num_tokens, num_kv_heads, head_size]
        value: [num_tokens, num_kv_heads, head_size]
        slot_mapping: [num_tokens] ``block_id * block_size + offset``.

    Raises:
        IndexError: a slot outside the pool (a PAD block id leaked into the mapping).
    """
    block_size = key_cache.shape[2]
    num_slots = key_cache.shape[0] * block_size
    if len(slot_mapping) and (int(slot_mapping.min()) < 0 or int(slot_mapping.max()) >= num_slots):
        raise IndexError(f"slot_mapping has slots outside [0, {num_slots}): {slot_mapping.tolist()}")
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    key_cache[blocks, :, offsets] = key
    value_cache[blocks, :, offsets] = value


def paged_attention_torch(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          inputs: StepInputs, scale: float) -> torch.Tensor:
    """Varlen paged attention, causal with history, one sequence at a time (the oracle path).

    Args:
        query: [num_tokens, num_heads, head_size] packed like ``inputs.input_ids``.
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        inputs: ``block_tables``, ``context_lens``, ``query_start_loc`` say what each sequence reads.
        scale: multiplies q·k.

    Returns:
        [num_tokens, num_heads, head_size]

    Raises:
        IndexError: a table lists ``PAD_BLOCK_ID`` inside a sequence's context.
    """
    block_size = key_cache.shape[2]
    group = query.shape[1] // key_cache.shape[1]
    out = torch.empty_like(query)
    starts = inputs.query_start_loc.tolist()
    for i, kv_len in enumerate(inputs.context_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        ids = inputs.block_tables[i, : -(-kv_len // block_size)].to(torch.long)
        if bool((ids == PAD_BLOCK_ID).any()):
            raise IndexError(f"block_tables row {i} has PAD_BLOCK_ID inside its {kv_len} tokens")
        ids = ids.to(key_cache.device)
        # [n_blocks, Hkv, bs, D] -> [n_blocks * bs, Hkv, D], keep the first kv_len tokens
        k = key_cache[ids].transpose(1, 2).reshape(-1, *key_cache.shape[1:2], key_cache.shape[3])[:kv_len]
        v = value_cache[ids].transpose(1, 2).reshape(-1, *value_cache.shape[1:2], value_cache.shape[3])[:kv_len]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[a:b], k) * scale  # [Hq, q_len, kv_len]
        q_pos = torch.arange(kv_len - (b - a), kv_len, device=query.device)
        mask = torch.arange(kv_len, device=query.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~mask, float("-inf"))
        # NOTE: softmax in float32, as Hugging Face's eager attention does (module docstring).
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out[a:b] = torch.einsum("hqk,khd->qhd", probs, v)
    return out
