"""Given plumbing for Lab 6 (you do not write this): a request's state, its output, the chained
block hash and the sampler.

Your ``starter.py`` imports these; the tests read the same attributes, so keep their names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class SequenceStatus(enum.Enum):
    """Where a request is: in the waiting queue, in the running batch, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One request: its tokens, how many of them have K/V in the pool, and the blocks it holds.

    Attributes:
        seq_id: the request id (arrival order: smaller arrived earlier).
        token_ids: prompt tokens then every generated token.
        num_prompt_tokens: length of the prompt.
        sampling_params: the request's ``SamplingParams``.
        num_computed_tokens: leading tokens whose K/V are in the pool (computed, or reused from
            the prefix cache). Tokens after them are still to be run through the model.
        block_table: the blocks holding the sequence's tokens, in logical order.
        block_hashes: chained hashes of the leading full blocks registered in the prefix cache
            (``block_hashes[i]`` belongs to ``block_table[i]``).
        status: waiting, running or finished.
        num_preemptions: how often the request lost its blocks and was re-queued.
        first_token_step: the engine step that produced the first output token (TTFT in steps),
            counted from 0: the value of ``num_steps`` before that step's increment.
        num_cached_prompt_tokens: tokens served from the prefix cache at its latest admission
            (after a preemption the match may cover output tokens too: the name is vLLM's).
    """

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: object
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    first_token_step: int | None = None
    num_cached_prompt_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        """How many tokens were generated."""
        return self.num_tokens - self.num_prompt_tokens


@dataclass
class RequestOutput:
    """A finished request, as ``LLM.generate`` returns it (vLLM's ``RequestOutput``, cut down).

    Attributes:
        seq_id: the request id.
        prompt_token_ids: the prompt.
        output_token_ids: the generated tokens.
        num_cached_prompt_tokens: tokens served from the prefix cache (latest admission).
        num_preemptions: how often the request was preempted.
    """

    seq_id: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0


def block_hash(parent_hash: int | None, token_ids: list[int]) -> int:
    """Chained hash of one full block: identifies the whole prefix up to and including it.

    Lab 1 teaches the production version (``hashlib`` over the bytes). Here Python's ``hash`` of
    a tuple of ints is enough: it is the same in every process (only ``str``/``bytes`` hashes
    are randomised) and the engine never stores it.

    NOTE: the first block's missing parent is hashed as the int -1, not as ``None``: before
    Python 3.12 ``hash(None)`` comes from ``None``'s address and differs between processes.
    No ``hash()`` result is ever -1 (CPython reserves it), so -1 cannot be a real parent.

    Args:
        parent_hash: the previous block's hash, None for the first block.
        token_ids: the block's ``block_size`` tokens.

    Returns:
        The hash.
    """
    return hash((-1 if parent_hash is None else parent_hash, tuple(token_ids)))


def sample(logits: torch.Tensor, temperatures: list[float],
           generators: list[torch.Generator | None]) -> list[int]:
    """Picks one token per row: argmax at temperature 0, else a draw from softmax(logits / T).

    Args:
        logits: [num_seqs, vocab_size]
        temperatures: per row, >= 0.
        generators: per row, the request's seeded generator (None: torch's global one).

    Returns:
        One token id per row.
    """
    tokens = []
    for row, temperature, generator in zip(logits, temperatures, generators):
        if temperature == 0:
            # NOTE: argmax takes the first maximum, as transformers' greedy search does.
            tokens.append(int(torch.argmax(row)))
        else:
            probs = torch.softmax(row.to(torch.float64) / temperature, dim=-1)
            tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    return tokens
