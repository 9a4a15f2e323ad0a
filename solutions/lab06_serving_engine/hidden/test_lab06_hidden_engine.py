"""Lab 6, hidden test (instructor-only; stripped from the student release, run at grading).

Everything at once — a tiny pool, a tiny budget, shared prefixes, a second generate on the
same engine — where the public tests switch features on one at a time.
"""

from __future__ import annotations

import pytest
import torch

from labs.lab06_serving_engine._cases import (
    BLOCK_SIZE,
    check_block_invariants,
    hf_tokens,
    mismatch_report,
    paged_model,
    random_prompts,
)


@pytest.mark.points(3)
def test_hidden_preemption_chunking_and_prefix_hits_together(impl):
    """With 12 blocks, a 6-token budget and prompts sharing an 8-token prefix, two successive
    generate calls on one engine give transformers' tokens, preempt, hit the cache, and leave
    every block free."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: labs/lab06's conftest does not reach hidden/ (see there)
    try:
        _run(impl)
    finally:
        torch.set_num_threads(saved)


def _run(impl):
    system = random_prompts((8,), seed=11)[0]
    prompts = [system + t for t in random_prompts((5, 2, 9, 1, 6), seed=12)]
    llm = impl.LLM(paged_model(), num_blocks=12, block_size=BLOCK_SIZE, max_num_batched_tokens=6,
                   max_num_seqs=4)
    params = impl.SamplingParams(max_tokens=8)
    for batch in (prompts, prompts[::-1]):
        got = [o.output_token_ids for o in llm.generate(batch, params)]
        report = mismatch_report(batch, got, hf_tokens(batch, 8))
        assert not report, f"tokens differ from transformers':\n{report}"
        check_block_invariants(llm)
    assert llm.stats["num_preemptions"] > 0 and llm.stats["num_prefix_hit_tokens"] > 0, (
        f"stats {llm.stats}: expected both preemptions and prefix-cache hits in this workload")
    assert llm.block_manager.num_free_blocks == 12, "blocks leaked"
