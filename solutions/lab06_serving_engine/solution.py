"""Lab 6 — a mini serving engine: continuous batching over a paged KV cache.

``LLM.generate`` turns prompts into tokens the way vLLM does, one *step* at a time:

  1. the ``Scheduler`` picks which requests run this step and how many of their tokens, under a
     token budget: running requests first (decodes, unfinished prompt chunks), then waiting ones;
     a long prompt is split across steps (chunked prefill); when the pool runs dry the newest
     running request is preempted — its blocks freed, its KV to be recomputed later;
  2. the ``KVBlockManager`` gives each request the blocks its tokens need, reusing blocks of an
     identical, already computed prompt prefix (prefix caching, Lab 1's chained block hashes);
  3. ``prepare_inputs`` packs the step's tokens with their positions, slots and block tables;
  4. the model (``reference/llama.py``) writes the new K/V into those slots and attends through
     the tables; the engine samples one token for every request whose tokens are all computed.

Invariants after every step (the tests check them):
  * every block's ref_count equals the number of live requests whose ``block_table`` holds it;
  * free blocks + blocks in use == num_blocks; nothing is held by a finished request;
  * a step schedules at most ``max_num_batched_tokens`` tokens and ``max_num_seqs`` requests;
  * a request's ``block_table`` covers exactly its ``num_computed_tokens`` plus this step's tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from labs.lab06_serving_engine._engine import KVBlockManagerBase, LLMBase, SchedulerBase
from labs.lab06_serving_engine._sequence import (
    RequestOutput,
    Sequence,
    SequenceStatus,
    block_hash,
    sample,
)
from reference.checks import check_int
from reference.errors import OutOfBlocksError, SequenceTooLongError
from reference.layout import PAD_BLOCK_ID, num_blocks_for
from reference.llama import StepInputs


@dataclass
class SamplingParams:
    """How to sample a request's tokens (vLLM's ``SamplingParams``, cut down).

    Attributes:
        max_tokens: tokens to generate (there is no EOS: every request generates exactly this).
        temperature: 0 for greedy (argmax), else softmax(logits / temperature) sampling.
        seed: seeds the request's own generator when sampling; None uses torch's global one.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        """Validates the fields.

        Raises:
            TypeError: ``max_tokens`` or ``seed`` not an int, ``temperature`` not a real number.
            ValueError: ``max_tokens < 1``, ``temperature`` negative or not finite.
        """
        check_int("max_tokens", self.max_tokens, min_value=1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real):
            raise TypeError(f"temperature must be a float, got {type(self.temperature).__name__} "
                            f"{self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.seed is not None:
            check_int("seed", self.seed)


class KVBlockManager(KVBlockManagerBase):
    """Which blocks each request holds, and the prefix cache of computed full blocks.

    The constructor, ``num_free_blocks`` and ``prefix_hit_rate`` are given
    (``_engine.KVBlockManagerBase``: ``allocator``, ``hash_to_block``, ``num_queried_tokens``,
    ``num_hit_tokens``...).
    """

    def num_blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Returns how many more blocks ``seq`` must take to hold ``num_tokens`` tokens.

        Args:
            seq: the request.
            num_tokens: tokens it must hold (computed ones plus this step's).

        Returns:
            ``ceil(num_tokens / block_size) - len(seq.block_table)``, at least 0.
        """
        return max(0, num_blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grows ``seq.block_table`` so it holds ``num_tokens`` tokens, all or nothing.

        Args:
            seq: the request.
            num_tokens: tokens it must hold.

        Raises:
            OutOfBlocksError: not enough free blocks (nothing was taken).
        """
        needed = self.num_blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"allocate(seq_id={seq.seq_id}, num_tokens={num_tokens}): needs "
                                   f"{needed} blocks, {self.num_free_blocks} free")
        seq.block_table.extend(self.allocator.allocate_n(needed))

    def free(self, seq: Sequence) -> None:
        """Drops the request's hold on every block it has; blocks nobody holds leave the cache.

        Args:
            seq: the request (its ``block_table`` and ``block_hashes`` are emptied).
        """
        self.allocator.free_blocks(seq.block_table)
        for block_id, h in zip(seq.block_table, seq.block_hashes):
            # NOTE: a free block will be handed out again and overwritten: it must not stay
            # findable. Only the cache's own entry goes (another request may own the hash).
            if self.allocator.get_ref_count(block_id) == 0 and self.hash_to_block.get(h) == block_id:
                del self.hash_to_block[h]
        seq.block_table = []
        seq.block_hashes = []

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Finds the cached blocks holding the leading full blocks of ``seq``'s tokens.

        Changes nothing. At least the last token is never matched: its logits are needed.

        Args:
            seq: a request holding no blocks.

        Returns:
            (block_ids, hashes) of the longest cached run of leading full blocks.
        """
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        block_ids, hashes, parent = [], [], None
        for i in range((seq.num_tokens - 1) // bs):
            h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block_ids.append(block_id)
            hashes.append(h)
            parent = h
        return block_ids, hashes

    def use_prefix(self, seq: Sequence, block_ids: list[int], hashes: list[int]) -> None:
        """Shares matched blocks with ``seq``: their tokens count as computed.

        Args:
            seq: a request holding no blocks.
            block_ids: from :meth:`match_prefix`.
            hashes: from :meth:`match_prefix`.
        """
        for block_id in block_ids:
            self.allocator.increase_ref_count(block_id)
        seq.block_table = list(block_ids)
        seq.block_hashes = list(hashes)
        seq.num_computed_tokens = len(block_ids) * self.block_size
        seq.num_cached_prompt_tokens = seq.num_computed_tokens
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += seq.num_computed_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers every newly *computed* full block of ``seq`` under its chained hash.

        Args:
            seq: a request whose ``num_computed_tokens`` just grew.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            seq.block_hashes.append(h)
            # NOTE: an identical block computed by another request keeps the entry.
            self.hash_to_block.setdefault(h, seq.block_table[i])


class Scheduler(SchedulerBase):
    """Continuous batching: which requests run each step, and how many of their tokens.

    The constructor, ``add`` and ``has_unfinished`` are given (``_engine.SchedulerBase``:
    ``waiting``, ``running``, ``num_preemptions``...).
    """

    def schedule(self) -> list[tuple[Sequence, int]]:
        """Picks this step's requests and token counts, taking the blocks they need.

        Running requests go first, oldest first: a decode takes 1 token, an unfinished prompt its
        next chunk (what is left, capped by the budget left). When blocks run out the newest
        running request is preempted (possibly the one being scheduled). Only if nobody was
        preempted, waiting requests are admitted in order — with their prefix-cache hits — while
        budget, ``max_num_seqs`` and blocks allow.

        Returns:
            (request, number of new tokens) pairs in batch order; each request's tokens are
            ``token_ids[num_computed_tokens : num_computed_tokens + n]``.
        """
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        idx = 0
        while idx < len(self.running) and budget > 0:
            seq = self.running[idx]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while (self.block_manager.num_blocks_needed(seq, seq.num_computed_tokens + num_new)
                   > self.block_manager.num_free_blocks):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            self.block_manager.allocate(seq, seq.num_computed_tokens + num_new)
            scheduled.append((seq, num_new))
            budget -= num_new
            idx += 1
        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.max_num_seqs):
            if not self._admit(self.waiting[0], budget, scheduled):
                break
            budget -= scheduled[-1][1]
        return scheduled

    def _admit(self, seq: Sequence, budget: int, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Moves the head of the waiting queue to the running batch if its blocks fit.

        Args:
            seq: the head of the waiting queue (``waiting[0]``).
            budget: tokens left in this step's budget (> 0); the first chunk is capped by it.
            scheduled: this step's (request, tokens) pairs; an admitted request is appended.

        Returns:
            True if admitted; False if its blocks do not fit, with nothing changed (it stays at
            the head and ``schedule`` stops admitting). ``schedule`` checks ``max_num_seqs``
            and the budget before calling.
        """
        bm = self.block_manager
        block_ids, hashes = bm.match_prefix(seq)
        num_cached = len(block_ids) * bm.block_size
        num_new = min(seq.num_tokens - num_cached, budget)
        needed = num_blocks_for(num_cached + num_new, bm.block_size) - len(block_ids)
        if needed > bm.num_free_blocks:
            return False
        self.waiting.popleft()
        bm.use_prefix(seq, block_ids, hashes)
        bm.allocate(seq, num_cached + num_new)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        scheduled.append((seq, num_new))
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: frees the request's blocks and re-queues it at the front.

        Args:
            seq: a running request.
        """
        self.running.remove(seq)
        self.block_manager.free(seq)
        # NOTE: its K/V are gone with its blocks: every token must be computed again.
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, scheduled: list[tuple[Sequence, int]],
               sampled: dict[int, int]) -> list[Sequence]:
        """Books a finished step: computed tokens, new cache entries, sampled tokens, finishes.

        Args:
            scheduled: this step's (request, number of new tokens), from :meth:`schedule`.
            sampled: seq_id -> sampled token, for the requests whose tokens are now all computed.

        Returns:
            The requests that finished this step (their blocks are freed).
        """
        finished = []
        for seq, num_new in scheduled:
            seq.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(seq)
            if seq.seq_id not in sampled:
                continue
            seq.token_ids.append(sampled[seq.seq_id])
            if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.running.remove(seq)
                self.block_manager.free(seq)
                finished.append(seq)
        return finished


def prepare_inputs(scheduled: list[tuple[Sequence, int]], block_size: int,
                   device: str | torch.device = "cpu") -> StepInputs:
    """Packs one step's tokens with their positions, slots and the block tables.

    Args:
        scheduled: (request, number of new tokens) pairs in batch order; each request's block
            table already covers ``num_computed_tokens + n`` tokens.
        block_size: tokens per block.
        device: where the tensors go.

    Returns:
        ``StepInputs`` (``reference/llama.py``: ``input_ids``, ``positions``, ``slot_mapping``,
        ``block_tables``, ``context_lens``, ``query_start_loc``, ...): row ``i`` of ``block_tables`` and
        ``context_lens`` belongs to ``scheduled[i]``; new tokens of request ``i`` sit at
        ``query_start_loc[i]:query_start_loc[i + 1]``.
    """
    input_ids, positions, slots, lens = [], [], [], []
    for seq, num_new in scheduled:
        start = seq.num_computed_tokens
        # NOTE: a chunk continues its sequence: positions (RoPE) start at the history's length.
        pos = range(start, start + num_new)
        input_ids.extend(seq.token_ids[start:start + num_new])
        positions.extend(pos)
        slots.extend(seq.block_table[p // block_size] * block_size + p % block_size for p in pos)
        lens.append(start + num_new)
    width = max((len(seq.block_table) for seq, _ in scheduled), default=0)
    block_tables = torch.full((len(scheduled), max(width, 1)), PAD_BLOCK_ID, dtype=torch.int32)
    for row, (seq, _) in enumerate(scheduled):
        block_tables[row, :len(seq.block_table)] = torch.tensor(seq.block_table, dtype=torch.int32)
    counts = torch.tensor([n for _, n in scheduled], dtype=torch.int64)
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    return StepInputs(
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=block_tables.to(device),
        context_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        query_start_loc=query_start_loc.to(device),
        logits_indices=(query_start_loc[1:] - 1).to(device),
    )


class LLM(LLMBase):
    """The engine: ``generate(prompts, SamplingParams)`` shaped like vLLM's ``LLM``.

    The constructor (its arguments: ``model, num_blocks, block_size, max_num_batched_tokens,
    max_num_seqs, max_model_len, enable_prefix_caching, attention_backend,
    block_allocator``), ``stats``, ``has_unfinished_requests`` and ``_finish`` are given
    (``_engine.LLMBase``: ``block_manager``, ``scheduler``, ``kv_caches``, ``sequences``,
    ``next_seq_id``, ``num_steps``, ``peak_num_used_blocks``, ``last_scheduled``,
    ``last_logits``, ``_generators``...).
    """

    _block_manager_class = KVBlockManager
    _scheduler_class = Scheduler

    def check_request(self, prompt: object, params: object, name: str = "prompt") -> None:
        """Validates one request without changing anything.

        Args:
            prompt: token ids.
            params: a ``SamplingParams``.
            name: how error messages name the prompt (e.g. ``"prompts[2]"``).

        Raises:
            TypeError: ``prompt`` not a list of ints; ``params`` not a ``SamplingParams`` (the
                message names ``sampling_params``).
            ValueError: empty prompt, a token id outside ``[0, vocab_size)``.
            reference.errors.SequenceTooLongError: ``len(prompt) + max_tokens`` exceeds
                ``max_model_len`` (which the pool can always hold).
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(f"{name} must be a list of token ids, got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise ValueError(f"{name} is empty: a request needs at least one prompt token")
        vocab = self.model.shape.vocab_size
        for i, token in enumerate(prompt):
            check_int(f"{name}[{i}]", token)
            if not 0 <= token < vocab:
                raise ValueError(f"{name}[{i}]={token} is not a token id in [0, {vocab})")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise SequenceTooLongError(
                f"{name} has {len(prompt)} tokens and max_tokens={params.max_tokens}: {total} > "
                f"max_model_len={self.max_model_len} (the pool holds {self.num_blocks} blocks of "
                f"{self.block_size} tokens)")

    def add_request(self, prompt: list[int], params: "SamplingParams") -> int:
        """Validates a request and queues it.

        Args:
            prompt: token ids.
            params: how to sample.

        Returns:
            The new request's ``seq_id``.

        Raises:
            TypeError / ValueError / SequenceTooLongError: see :meth:`check_request` (nothing
            queued).
        """
        self.check_request(prompt, params)
        seq = Sequence(self.next_seq_id, [int(t) for t in prompt], len(prompt), params)
        self.next_seq_id += 1
        self.sequences[seq.seq_id] = seq
        generator = None
        if params.temperature > 0 and params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        self._generators[seq.seq_id] = generator
        self.scheduler.add(seq)
        return seq.seq_id

    def step(self) -> list[RequestOutput]:
        """Runs one engine step: schedule, prepare inputs, run the model, sample, book.

        Sets ``last_scheduled`` (this step's (request, tokens) pairs) and ``last_logits``
        (replaced, not added to: only the requests that sampled a token this step).

        Returns:
            Outputs of the requests that finished this step.

        Raises:
            RuntimeError: the scheduler scheduled no token, whether requests are unfinished but
                cannot progress or there is no request at all (call it while
                ``has_unfinished_requests()``).
        """
        scheduled = self.scheduler.schedule()
        self.last_scheduled = scheduled
        if not scheduled or any(n <= 0 for _, n in scheduled):
            raise RuntimeError(f"step {self.num_steps}: the scheduler scheduled {scheduled!r} while "
                               f"{len(self.scheduler.waiting)} requests wait and "
                               f"{len(self.scheduler.running)} run: the engine cannot progress")
        used = self.num_blocks - self.block_manager.num_free_blocks
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, used)
        inputs = prepare_inputs(scheduled, self.block_size, self.model.device)
        logits = self.model.forward(inputs, self.kv_caches)
        # Only a request whose every token now has K/V gets a token; a prompt chunk does not.
        rows = [i for i, (seq, n) in enumerate(scheduled)
                if seq.num_computed_tokens + n == seq.num_tokens]
        seqs = [scheduled[i][0] for i in rows]
        tokens = sample(logits[rows], [s.sampling_params.temperature for s in seqs],
                        [self._generators[s.seq_id] for s in seqs])
        self.last_logits = {s.seq_id: logits[i] for s, i in zip(seqs, rows)}
        for seq in seqs:
            if seq.first_token_step is None:
                seq.first_token_step = self.num_steps
        finished = self.scheduler.update(scheduled, {s.seq_id: t for s, t in zip(seqs, tokens)})
        self.num_steps += 1
        return [self._finish(seq) for seq in finished]

    def generate(self, prompts: list[list[int]],
                 sampling_params: "SamplingParams | list[SamplingParams]") -> list[RequestOutput]:
        """Generates for every prompt; steps until all of them finish.

        Args:
            prompts: token ids per prompt.
            sampling_params: one for all prompts, or one per prompt.

        Returns:
            One ``RequestOutput`` per prompt, in the prompts' order.

        Raises:
            TypeError: ``sampling_params`` neither a ``SamplingParams`` nor a list of them (the
                message names ``sampling_params``); a prompt :meth:`check_request` refuses.
            ValueError: a list of ``sampling_params`` not exactly one per prompt (the message
                names ``sampling_params``); a prompt :meth:`check_request` refuses.
            reference.errors.SequenceTooLongError: as :meth:`check_request`.
            In each case nothing was queued: every request is checked before the first is added,
            and each prompt's error names it ``prompts[i]``.
        """
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
        params = sampling_params
        if not isinstance(params, (list, tuple)):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            self.check_request(prompt, p, name=f"prompts[{i}]")
        ids = [self.add_request(prompt, p) for prompt, p in zip(prompts, params)]
        outputs: dict[int, RequestOutput] = {}
        while not all(i in outputs for i in ids):
            for out in self.step():
                outputs[out.seq_id] = out
        return [outputs.pop(i) for i in ids]

