"""Lab 6 test helpers (given, protected): the tiny model, its Hugging Face twin, fixed prompts,
and the scheduler invariants every test can check.

Building the model and Hugging Face's reference tokens costs a few seconds, so both are cached
for the whole test process.
"""

from __future__ import annotations

import functools
import random

from reference.grader.proxy import gather
from reference.llama import PagedLlama, hf_greedy_generate, make_tiny_hf_llama

BLOCK_SIZE = 4
MAX_TOKENS = 10


@functools.lru_cache(maxsize=None)
def hf_model():
    """The seeded float64 ``LlamaForCausalLM`` every test serves."""
    return make_tiny_hf_llama(seed=0)


@functools.lru_cache(maxsize=None)
def paged_model() -> PagedLlama:
    """The same weights in the workbook's paged decoder (oracle attention)."""
    return PagedLlama.from_hf(hf_model())


def random_prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    """Seeded random prompts of the given lengths (token ids in [0, 256))."""
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


@functools.lru_cache(maxsize=None)
def _hf_tokens(prompts: tuple[tuple[int, ...], ...], max_tokens: int) -> tuple[tuple[int, ...], ...]:
    out = hf_greedy_generate(hf_model(), [list(p) for p in prompts], max_tokens)
    return tuple(tuple(o) for o in out)


def hf_tokens(prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Hugging Face ``generate(do_sample=False)``'s tokens for each prompt (cached)."""
    return [list(o) for o in _hf_tokens(tuple(map(tuple, prompts)), max_tokens)]


def mismatch_report(prompts, got, want) -> str:
    """Describes the first differing token of every mismatching request, or '' when all match."""
    lines = []
    for i, (p, g, w) in enumerate(zip(prompts, got, want)):
        if list(g) != list(w):
            k = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            lines.append(f"  request {i} (prompt of {len(p)} tokens): first difference at output "
                         f"token {k}: got {list(g)[k:k + 3]}..., Hugging Face {list(w)[k:k + 3]}...")
    return "\n".join(lines)


def _observe_blocks(llm) -> dict:
    """What :func:`check_block_invariants` checks, read in one go (run through ``gather``:
    where the engine lives, one round trip when graded isolated)."""
    bm = llm.block_manager
    return {
        "live": [(seq.seq_id, seq.status.value, list(seq.block_table))
                 for seq in [*llm.scheduler.running, *llm.scheduler.waiting]],
        "waiting": [(seq.seq_id, list(seq.block_table)) for seq in llm.scheduler.waiting],
        "refs": [bm.allocator.get_ref_count(b) for b in range(bm.num_blocks)],
        "num_free_blocks": bm.num_free_blocks,
        "num_blocks": bm.num_blocks,
    }


def check_block_invariants(llm) -> None:
    """Asserts: ref counts equal table holdings, free + used == num_blocks, no finished holder."""
    state = gather(_observe_blocks, llm)
    holdings: dict[int, int] = {}
    for seq_id, status, block_table in state["live"]:
        assert status != "finished", f"request {seq_id} is finished but still queued"
        for block_id in block_table:
            holdings[block_id] = holdings.get(block_id, 0) + 1
    for seq_id, block_table in state["waiting"]:
        assert not block_table, (
            f"waiting request {seq_id} holds blocks {block_table}: a preempted request "
            "must give all its blocks back")
    num_blocks, num_free = state["num_blocks"], state["num_free_blocks"]
    for block_id, ref in enumerate(state["refs"]):
        held = holdings.get(block_id, 0)
        assert held == ref, (
            f"block {block_id} has ref_count {ref} but {held} live requests hold it: a block "
            "was leaked (finished or preempted request not freed) or shared without a reference")
    assert num_free == num_blocks - len(holdings), (
        f"{num_free} blocks free but {len(holdings)} of {num_blocks} are held")


def make_sequence(impl, seq_id: int, tokens, num_computed: int, block_table):
    """A request in a given state: ``tokens`` with ``num_computed`` of them in the cache at the
    blocks of ``block_table`` (four tokens to generate).

    NOTE: made where the implementation runs (the grading worker, when isolated): the block
    manager edits the request's lists in place.
    """
    from labs.lab06_serving_engine._sequence import Sequence
    from reference.grader.proxy import given

    seq = given(impl, Sequence)(seq_id, list(tokens), len(tokens), impl.SamplingParams(max_tokens=4))
    seq.num_computed_tokens = num_computed
    seq.block_table = list(block_table)
    return seq
