"""Lab 6: the engine's tokens are exactly Hugging Face's, whatever the scheduler does."""

from __future__ import annotations

import pytest

from labs.lab06_serving_engine._cases import (
    BLOCK_SIZE,
    MAX_TOKENS,
    check_block_invariants,
    hf_tokens,
    mismatch_report,
    paged_model,
    random_prompts,
)

MIXED_LENGTHS = (1, 3, 4, 5, 9, 16, 23, 37)


def _generate(impl, prompts, **engine_kwargs):
    llm = impl.LLM(paged_model(), block_size=BLOCK_SIZE, **engine_kwargs)
    outputs = llm.generate(prompts, impl.SamplingParams(max_tokens=MAX_TOKENS))
    return llm, [o.output_token_ids for o in outputs]


def _assert_matches_hf(prompts, got, what):
    report = mismatch_report(prompts, got, hf_tokens(prompts))
    assert not report, f"{what}: tokens differ from transformers' greedy generate:\n{report}"


@pytest.mark.points(5)
def test_greedy_tokens_match_hugging_face_on_a_mixed_batch(impl):
    """Eight prompts of 1 to 37 tokens (block boundaries included) served together in a roomy
    pool generate exactly transformers' greedy tokens, and every block is free afterwards."""
    prompts = random_prompts(MIXED_LENGTHS, seed=1)
    llm, got = _generate(impl, prompts, num_blocks=64, max_num_batched_tokens=256)
    _assert_matches_hf(prompts, got, "continuous batching, no pressure (check slot_mapping, "
                       "positions and block tables in prepare_inputs)")
    assert llm.block_manager.num_free_blocks == 64, (
        f"{64 - llm.block_manager.num_free_blocks} blocks still held after every request finished: "
        "finished requests must free their blocks")


@pytest.mark.points(5)
def test_tokens_match_when_the_pool_forces_preemption(impl):
    """In a pool of 14 blocks (56 tokens) that cannot hold the batch, the scheduler preempts by
    recompute, and every request still generates exactly transformers' tokens."""
    prompts = random_prompts((9, 12, 7, 14, 10, 5), seed=2)
    llm, got = _generate(impl, prompts, num_blocks=14, max_num_batched_tokens=64)
    assert llm.stats["num_preemptions"] > 0, (
        "no preemption happened in a pool too small for the batch: the test's premise failed "
        "(does schedule() preempt when num_blocks_needed exceeds num_free_blocks?)")
    _assert_matches_hf(prompts, got, "after preemption (a resumed request must recompute its "
                       "whole KV, and its block table row must follow it)")
    check_block_invariants(llm)
    assert llm.block_manager.num_free_blocks == 14, "blocks leaked after preemptions"


@pytest.mark.points(4)
def test_shared_prefixes_hit_the_cache_and_match(impl):
    """Requests sharing a 16-token system prompt reuse its computed blocks (hit rate > 0), an
    identical block-aligned prompt still computes its last token, and all tokens match."""
    system = random_prompts((16,), seed=3)[0]
    tails = random_prompts((3, 1, 6), seed=4)
    prompts = [system + tails[0], system + tails[1], system[:], system + tails[2], system[:8]]
    # NOTE: a budget of 20 admits the first request alone; its blocks are computed and cached
    # before the others are admitted, so they can hit.
    llm = impl.LLM(paged_model(), num_blocks=64, block_size=BLOCK_SIZE, max_num_batched_tokens=20)
    outs = llm.generate(prompts, impl.SamplingParams(max_tokens=MAX_TOKENS))
    _assert_matches_hf(prompts, [o.output_token_ids for o in outs], "with prefix-cache hits (a "
                       "hit must cover only computed full blocks, and never the last prompt token)")
    assert llm.stats["prefix_hit_rate"] > 0 and llm.stats["num_prefix_hit_tokens"] > 0, (
        f"stats {llm.stats}: no prefix-cache hit although 4 prompts share computed blocks "
        "(are computed full blocks registered in cache_full_blocks and found by match_prefix?)")
    assert outs[2].num_cached_prompt_tokens < len(prompts[2]), (
        "a prompt was served entirely from the cache: its last token must be computed for logits")
    assert llm.block_manager.num_free_blocks == 64 and not llm.block_manager.hash_to_block, (
        "after all requests finished, blocks are still held or freed blocks are still findable "
        "in hash_to_block (free must drop the cache entry of a block nobody holds)")


@pytest.mark.points(4)
def test_chunked_prefill_forced_small_matches(impl):
    """With a budget of 5 tokens a step, prompts of up to 37 tokens are prefilled in chunks
    whose positions continue the history, and the tokens match transformers'."""
    prompts = random_prompts((37, 12, 6, 21), seed=5)
    llm, got = _generate(impl, prompts, num_blocks=48, max_num_batched_tokens=5)
    _assert_matches_hf(prompts, got, "with chunked prefill (a chunk's positions start at "
                       "num_computed_tokens, not 0)")
    assert llm.stats["num_steps"] >= 37 // 5, "a 37-token prompt cannot be prefilled in fewer steps"


@pytest.mark.points(3)
def test_step_logits_match_the_dense_model(impl):
    """The logits each token was sampled from are within 1e-6 of the dense model's logits for the
    same prefix, through chunking and preemption; ``last_logits`` holds only the requests
    scheduled (and sampled) in the latest step.

    NOTE: the model is float64 but, like transformers, normalises and takes the softmax in
    float32, so batching differently moves logits by ~1e-7; a wrong slot, block or position
    moves them by ~1e-1."""
    prompts = random_prompts((11, 6, 17), seed=6)
    llm = impl.LLM(paged_model(), num_blocks=9, block_size=BLOCK_SIZE, max_num_batched_tokens=7)
    for p in prompts:
        llm.add_request(p, impl.SamplingParams(max_tokens=6))
    model = paged_model()
    worst = 0.0
    while llm.has_unfinished_requests():
        llm.step()
        scheduled = {s.seq_id: s for s, _ in llm.last_scheduled}
        stale = sorted(set(llm.last_logits) - set(scheduled))
        assert not stale, (
            f"step {llm.num_steps}: last_logits holds seq_ids {stale}, which were not scheduled "
            "this step: last_logits must be replaced each step, holding only the requests that "
            "sampled a token in it (LLM.step's docstring)")
        for seq_id, logits in llm.last_logits.items():
            seq = scheduled[seq_id]
            dense = model.dense_logits(seq.token_ids[:-1])[-1]
            worst = max(worst, float((logits - dense).abs().max()))
    assert worst < 1e-6, (
        f"a step's logits differ from the dense model's by {worst:.3g} (tolerance 1e-6): some "
        "token's K/V was read from the wrong slot, block or position")
