"""Given plumbing for Lab 6 (you do not write this): the constructors and counters of the
engine's three classes, as base classes that ``starter.py`` subclasses.

``KVBlockManager``, ``Scheduler`` and ``LLM`` in your module inherit from
:class:`KVBlockManagerBase`, :class:`SchedulerBase` and :class:`LLMBase`. What they give you is
bookkeeping — the attributes every method reads, validated sizes, the counters ``stats``
reports — so your TODOs are the engine's logic alone. The attributes set here are the names
the tests read (``llm.block_manager``, ``scheduler.running``, ``bm.hash_to_block``...): use
them, do not rename them.

The reference solution subclasses the same bases, so this code is kept once.
"""

from __future__ import annotations

from collections import deque

import torch

from labs.lab06_serving_engine._sequence import RequestOutput, Sequence, SequenceStatus
from reference.block_allocator import TrustedBlockAllocator
from reference.checks import check_int
from reference.llama import PagedLlama, check_attention_backend


class KVBlockManagerBase:
    """The state of a block manager: the allocator, the prefix cache and its hit counters.

    Attributes:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        enable_prefix_caching: whether computed full blocks are reused.
        allocator: block ids and ref counts (Lab 1's interface: ``allocate_n``, ``free_blocks``,
            ``increase_ref_count``, ``get_ref_count``, ``num_free_blocks``).
        hash_to_block: the prefix cache, chained block hash -> id of the block holding those
            tokens.
        num_queried_tokens: tokens looked up in the prefix cache: each admission adds every
            token the request holds then (its prompt; after a preemption, the prompt and the
            tokens it had generated).
        num_hit_tokens: of which served from cached blocks.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 allocator=None) -> None:
        """Creates a manager whose blocks are all free.

        Args:
            num_blocks: blocks in the pool.
            block_size: tokens per block.
            enable_prefix_caching: reuse computed full blocks of identical prefixes.
            allocator: block ids and ref counts with Lab 1's interface; None means
                ``reference.block_allocator.TrustedBlockAllocator`` (your Lab 1 ``BlockManager``
                plugs in unchanged).

        Raises:
            TypeError / ValueError: ``num_blocks`` or ``block_size`` is not an int >= 1.
        """
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        self.block_size = check_int("block_size", block_size, min_value=1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.allocator = allocator if allocator is not None else TrustedBlockAllocator(num_blocks)
        self.hash_to_block: dict[int, int] = {}  # chained hash -> block id holding those tokens
        self.num_queried_tokens = 0  # tokens looked up: seq.num_tokens per admission
        self.num_hit_tokens = 0  # of which served from cached blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds."""
        return self.allocator.num_free_blocks

    @property
    def prefix_hit_rate(self) -> float:
        """Fraction of looked-up tokens served from the prefix cache (0 before any lookup)."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class SchedulerBase:
    """The state of a scheduler: its queues, its limits and the preemption counter.

    Attributes:
        block_manager: the blocks of every request.
        max_num_batched_tokens: the token budget of one step.
        max_num_seqs: most requests in the running batch.
        waiting: requests waiting for admission, next to admit first.
        running: the running batch, oldest admission first.
        num_preemptions: how many preemptions happened so far.
    """

    def __init__(self, block_manager: KVBlockManagerBase, max_num_batched_tokens: int,
                 max_num_seqs: int) -> None:
        """Creates an empty scheduler.

        Args:
            block_manager: the blocks of every request.
            max_num_batched_tokens: the token budget of one step.
            max_num_seqs: most requests in the running batch.

        Raises:
            TypeError / ValueError: a limit that is not an int >= 1.
        """
        self.block_manager = block_manager
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens,
                                                min_value=1)
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, min_value=1)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest admission first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queues a new request at the back of the waiting queue.

        Args:
            seq: a request holding no blocks.
        """
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)


class LLMBase:
    """The state of an engine: the model and its KV pool, the block manager, the scheduler, the
    live requests and the counters.

    A subclass names the block manager and scheduler classes to build (your ``LLM`` names your
    ``KVBlockManager`` and ``Scheduler``) in ``_block_manager_class`` and ``_scheduler_class``.

    Attributes:
        model: the decoder; ``kv_caches``: its KV pool, ``num_blocks`` blocks of ``block_size``.
        max_model_len: the longest request accepted (prompt + max_tokens).
        block_manager: a ``_block_manager_class``; scheduler: a ``_scheduler_class``.
        sequences: live requests by seq_id; next_seq_id: the id the next request gets.
        num_steps: engine steps run; peak_num_used_blocks: most blocks in use after a schedule.
        last_scheduled: the latest step's (request, number of new tokens) pairs.
        last_logits: seq_id -> the logits it sampled from, for the requests that sampled a
            token in the latest step only (replaced each step, not added to).
    """

    _block_manager_class: type = KVBlockManagerBase
    _scheduler_class: type = SchedulerBase

    def __init__(self, model: PagedLlama, num_blocks: int, block_size: int = 16,
                 max_num_batched_tokens: int = 256, max_num_seqs: int = 64,
                 max_model_len: int | None = None, enable_prefix_caching: bool = True,
                 attention_backend: str = "oracle", block_allocator=None) -> None:
        """Allocates the KV pool and an empty scheduler.

        Args:
            model: the decoder (``reference.llama.PagedLlama``).
            num_blocks: blocks in the KV pool (every layer has this many).
            block_size: tokens per block.
            max_num_batched_tokens: token budget of one step (chunked prefill splits prompts to it).
            max_num_seqs: most requests running at once.
            max_model_len: longest request (prompt + max_tokens); None or more than the pool
                holds means what the pool holds, ``num_blocks * block_size``.
            enable_prefix_caching: reuse computed blocks of identical prompt prefixes.
            attention_backend: ``"oracle"`` (torch, CPU-OK) or ``"kernels"`` (Labs 4–5, GPU).
            block_allocator: Lab 1's interface; None means the trusted allocator.

        Raises:
            TypeError / ValueError: a bad size; unknown ``attention_backend``.
            reference.llama.BackendUnavailableError: ``"kernels"`` without a GPU.
        """
        self.model = model
        model.attention_backend = check_attention_backend(attention_backend,
                                                          model.weights["lm_head.weight"])
        self.block_size = check_int("block_size", block_size, min_value=1)
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        capacity = self.num_blocks * self.block_size
        if max_model_len is not None:
            check_int("max_model_len", max_model_len, min_value=1)
        self.max_model_len = min(max_model_len or capacity, capacity)
        self.block_manager = self._block_manager_class(num_blocks, block_size,
                                                       enable_prefix_caching, block_allocator)
        self.scheduler = self._scheduler_class(self.block_manager, max_num_batched_tokens,
                                               max_num_seqs)
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size)
        self.sequences: dict[int, Sequence] = {}  # live requests by seq_id
        self.next_seq_id = 0
        self.num_steps = 0
        self.peak_num_used_blocks = 0
        self.last_scheduled: list[tuple[Sequence, int]] = []
        self.last_logits: dict[int, torch.Tensor] = {}  # seq_id -> logits it was sampled from
        # seq_id -> the request's own sampling generator (None: torch's global one).
        self._generators: dict[int, torch.Generator | None] = {}

    @property
    def stats(self) -> dict:
        """Counters: steps, preemptions, prefix-cache hit rate, peak blocks in use."""
        return {"num_steps": self.num_steps,
                "num_preemptions": self.scheduler.num_preemptions,
                "prefix_hit_rate": self.block_manager.prefix_hit_rate,
                "num_prefix_hit_tokens": self.block_manager.num_hit_tokens,
                "peak_num_used_blocks": self.peak_num_used_blocks}

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_unfinished()

    def _finish(self, seq: Sequence) -> RequestOutput:
        """Forgets a finished request and returns its output.

        Args:
            seq: a request the scheduler just finished (its blocks already freed).

        Returns:
            Its ``RequestOutput``: prompt, generated tokens, prefix-cache hits, preemptions.
        """
        del self.sequences[seq.seq_id]
        del self._generators[seq.seq_id]
        return RequestOutput(seq.seq_id, seq.token_ids[:seq.num_prompt_tokens],
                             seq.output_token_ids, seq.num_cached_prompt_tokens,
                             seq.num_preemptions)
