"""Lab 6 (starter) — a mini serving engine: continuous batching over a paged KV cache.

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

Given code, in protected files this module imports: ``_sequence.py`` (a request's state, its
output, the chained block hash, the sampler) and ``_engine.py`` (the base classes of
``KVBlockManager``, ``Scheduler`` and ``LLM``: their constructors, the attributes they set,
and the counters). Your tasks are marked ``TODO(lab6.k)``.
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
        # TODO(lab6.1): validate max_tokens (int >= 1), temperature (real, finite, >= 0) and seed
        # (int or None) with typed errors naming the field.
        raise NotImplementedError("TODO(lab6.1): SamplingParams — validate every field")


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
        # TODO(lab6.2): ceil(num_tokens / block_size) minus the blocks seq already holds, never
        # negative.
        raise NotImplementedError("TODO(lab6.2): num_blocks_needed — ceil, minus what the request holds")

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grows ``seq.block_table`` so it holds ``num_tokens`` tokens, all or nothing.

        Args:
            seq: the request.
            num_tokens: tokens it must hold.

        Raises:
            OutOfBlocksError: not enough free blocks (nothing was taken).
        """
        # TODO(lab6.2): check the free count first (OutOfBlocksError, nothing taken), then
        # allocate_n and extend seq.block_table.
        raise NotImplementedError("TODO(lab6.2): allocate — all or nothing")

    def free(self, seq: Sequence) -> None:
        """Drops the request's hold on every block it has; blocks nobody holds leave the cache.

        Args:
            seq: the request (its ``block_table`` and ``block_hashes`` are emptied).
        """
        # TODO(lab6.2): free_blocks(seq.block_table); delete the cache entry of every block now at
        # ref_count 0 (only if the entry points at that block); empty block_table and
        # block_hashes.
        raise NotImplementedError("TODO(lab6.2): free — release blocks, drop dead cache entries")

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Finds the cached blocks holding the leading full blocks of ``seq``'s tokens.

        Changes nothing. At least the last token is never matched: its logits are needed.

        Args:
            seq: a request holding no blocks.

        Returns:
            (block_ids, hashes) of the longest cached run of leading full blocks.
        """
        # TODO(lab6.3): walk the full blocks of token_ids[:num_tokens - 1], chaining
        # block_hash(parent, tokens); stop at the first hash not in hash_to_block.
        raise NotImplementedError("TODO(lab6.3): match_prefix — chained lookup, never the last token")

    def use_prefix(self, seq: Sequence, block_ids: list[int], hashes: list[int]) -> None:
        """Shares matched blocks with ``seq``: their tokens count as computed.

        Args:
            seq: a request holding no blocks.
            block_ids: from :meth:`match_prefix`.
            hashes: from :meth:`match_prefix`.
        """
        # TODO(lab6.3): increase_ref_count of each matched block; set block_table, block_hashes,
        # num_computed_tokens, num_cached_prompt_tokens; count queried (seq.num_tokens) and hit
        # tokens.
        raise NotImplementedError("TODO(lab6.3): use_prefix — share the hits, count them")

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers every newly *computed* full block of ``seq`` under its chained hash.

        Args:
            seq: a request whose ``num_computed_tokens`` just grew.
        """
        # TODO(lab6.3): hash each full block below num_computed_tokens that has no hash yet
        # (chained), append to seq.block_hashes, setdefault it in hash_to_block.
        raise NotImplementedError("TODO(lab6.3): cache_full_blocks — register computed full blocks")


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
        # TODO(lab6.5): running first (decode 1 token / next prompt chunk, capped by the budget),
        # preempting the newest running request while blocks are short; then admit waiting
        # requests (with prefix hits) if nobody was preempted.
        raise NotImplementedError("TODO(lab6.5): schedule — continuous batching under a token budget")

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
        # TODO(lab6.5): match the prefix, size the first chunk, check the blocks fit; only then
        # pop, use_prefix, allocate, mark RUNNING, append to running and scheduled.
        raise NotImplementedError("TODO(lab6.5): _admit — admit the head of the waiting queue")

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: frees the request's blocks and re-queues it at the front.

        Args:
            seq: a running request.
        """
        # TODO(lab6.5): remove from running, free its blocks, forget its computed tokens, mark
        # WAITING, count it, put it at the FRONT of waiting.
        raise NotImplementedError("TODO(lab6.5): _preempt — preemption by recompute")

    def update(self, scheduled: list[tuple[Sequence, int]],
               sampled: dict[int, int]) -> list[Sequence]:
        """Books a finished step: computed tokens, new cache entries, sampled tokens, finishes.

        Args:
            scheduled: this step's (request, number of new tokens), from :meth:`schedule`.
            sampled: seq_id -> sampled token, for the requests whose tokens are now all computed.

        Returns:
            The requests that finished this step (their blocks are freed).
        """
        # TODO(lab6.6): advance num_computed_tokens, cache_full_blocks, append the sampled token,
        # finish (FINISHED, out of running, blocks freed) at max_tokens.
        raise NotImplementedError("TODO(lab6.6): update — book the step")


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
    # TODO(lab6.4): per request: tokens and positions from num_computed_tokens on, slot =
    # block_table[pos // bs] * bs + pos % bs; PAD-padded int32 block tables in batch order;
    # context_lens, query_start_loc, logits_indices.
    raise NotImplementedError("TODO(lab6.4): prepare_inputs — positions, slots and block tables of one step")


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
        # TODO(lab6.1): refuse a non-SamplingParams, a prompt that is not a non-empty list of ints
        # in [0, vocab_size), and len(prompt) + max_tokens > max_model_len (SequenceTooLongError);
        # change nothing.
        raise NotImplementedError("TODO(lab6.1): check_request — typed errors for bad prompts, state unchanged")

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
        # TODO(lab6.1): check_request, then make a Sequence with the next seq_id, remember it
        # (sequences, _generators: a seeded torch.Generator when temperature > 0 and seed is set)
        # and scheduler.add it.
        raise NotImplementedError("TODO(lab6.1): add_request — validate, then queue")

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
        # TODO(lab6.6): schedule (RuntimeError if nothing was scheduled), set last_scheduled,
        # track peak_num_used_blocks, prepare_inputs, model.forward, sample the requests whose
        # tokens are all computed (set last_logits, first_token_step), scheduler.update, num_steps
        # += 1.
        raise NotImplementedError("TODO(lab6.6): step — one engine step")

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
        # TODO(lab6.6): check every request first (nothing queued on a bad one), add them all,
        # step until each has finished, return outputs in prompt order.
        raise NotImplementedError("TODO(lab6.6): generate — the whole loop")

