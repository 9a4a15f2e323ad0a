"""Lab 6: the schedule itself, step by step, where a token-for-token match cannot see it.

A scheduler can serve every request the right tokens and still break its contract: admit out
of order, put a preempted request at the back of the queue, re-prefill only part of a
preempted request, cache a block late or never, or count wrongly. Each test runs a small
pool through a few steps and reads what the handout and the docstrings promise: the queue's
order, ``last_scheduled``, the prefix-cache hits and the counters.
"""

from __future__ import annotations

import pytest

from labs.lab06_serving_engine._cases import paged_model


def _llm(impl, *, num_blocks, block_size, budget=64, max_num_seqs=8):
    return impl.LLM(paged_model(), num_blocks=num_blocks, block_size=block_size,
                    max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)


def _batch(llm):
    return [(s.seq_id, n) for s, n in llm.last_scheduled]


def _waiting(llm):
    return [s.seq_id for s in llm.scheduler.waiting]


def _steps(llm, num_steps):
    """Runs ``num_steps`` steps; returns each step's batch (``_batch``)."""
    batches = []
    for _ in range(num_steps):
        llm.step()
        batches.append(_batch(llm))
    return batches


def _run(llm):
    """Steps to the end; returns the finished requests' outputs by id."""
    outs = {}
    while llm.has_unfinished_requests():
        for out in llm.step():
            outs[out.seq_id] = out
    return outs


@pytest.mark.points(1)
def test_a_preempted_request_goes_back_to_the_front_of_the_queue(impl):
    """A preempted request waits *ahead of* requests that were already waiting, and admission
    keeps that order: while it cannot be admitted, nobody behind it is."""
    llm = _llm(impl, num_blocks=3, block_size=4, max_num_seqs=2)
    for prompt in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        llm.add_request(prompt, impl.SamplingParams(max_tokens=5))
    llm.step()  # requests 0 and 1 (max_num_seqs=2): one block each; request 2 waits
    llm.step()  # both decodes need a 2nd block, 1 is free: request 1 preempts itself
    assert _waiting(llm) == [1, 2], (
        f"after request 1's preemption the waiting queue is {_waiting(llm)}, not [1, 2]: a "
        "preempted request goes to the front of the queue (appendleft), ahead of request 2")
    llm.step()
    assert _batch(llm) == [(0, 1)], (
        f"the step after the preemption scheduled {_batch(llm)}, not [(0, 1)]: request 1 (5 "
        "tokens, 2 blocks) does not fit the 1 free block, and request 2 waits behind it")


@pytest.mark.points(1)
def test_preempting_another_request_also_stops_admission(impl):
    """The no-admission rule holds for any preemption in the step, not only when a request
    preempts itself: here request 0's decode preempts request 1, and request 1 is not
    re-admitted in that step (it would be, through a prefix-cache hit, without the rule)."""
    llm = _llm(impl, num_blocks=4, block_size=2, budget=5)
    for _ in range(2):
        llm.add_request([210, 120, 44], impl.SamplingParams(max_tokens=5))
    llm.step()
    llm.step()
    llm.step()  # request 0's decode needs a block: request 1 is preempted
    state = (_batch(llm), _waiting(llm), llm.stats["num_preemptions"])
    assert state == ([(0, 1)], [1], 1), (
        f"(batch, waiting, preemptions) after the step that preempted request 1 = {state}, not "
        "([(0, 1)], [1], 1): once anyone was preempted in a step, admit nobody — set the flag for "
        "every victim, not only when the request being scheduled preempts itself")
    llm.step()
    assert llm.stats["num_preemptions"] == 1, (
        f"{llm.stats['num_preemptions']} preemptions after the next step, not 1: request 1 was "
        "admitted in the step that preempted it and then preempted again")


@pytest.mark.points(1)
def test_admission_stops_at_a_waiting_request_that_does_not_fit(impl):
    """Waiting requests are admitted in order: when the head of the queue does not fit, the
    requests behind it wait too, even one small enough to fit."""
    llm = _llm(impl, num_blocks=3, block_size=4)
    llm.add_request([1, 2, 3, 4], impl.SamplingParams(max_tokens=4))
    llm.add_request(list(range(20, 29)), impl.SamplingParams(max_tokens=1))  # 9 tokens: 3 blocks
    llm.add_request([7, 8], impl.SamplingParams(max_tokens=1))
    llm.step()
    state = (_batch(llm), _waiting(llm))
    assert state == ([(0, 4)], [1, 2]), (
        f"(batch, waiting) = {state}, not ([(0, 4)], [1, 2]): request 1 needs 3 blocks and 2 are "
        "free, so admission stops there; request 2 must not jump the queue")


@pytest.mark.points(1)
def test_a_readmitted_request_prefills_its_prompt_and_outputs(impl):
    """Re-admitted after a preemption, a request recomputes its whole sequence, prompt and the
    outputs it had: it is admitted only when blocks for all of it are free, in one chunk."""
    llm = _llm(impl, num_blocks=3, block_size=4)
    for prompt in ([1, 2, 3, 4], [5, 6, 7, 8]):
        llm.add_request(prompt, impl.SamplingParams(max_tokens=5))
    llm.step()
    llm.step()  # request 1 (5 tokens by now) preempts itself
    batches = _steps(llm, 4)
    assert batches[0] == [(0, 1)], (
        f"the step after the preemption scheduled {batches[0]}, not [(0, 1)]: request 1 holds 5 "
        "tokens (prompt + 1 output), which need 2 blocks, and only 1 is free — admit a "
        "re-admitted request for its whole sequence, not its prompt alone")
    assert batches[3] == [(1, 5)], (
        f"request 1's re-admission scheduled {batches[3]}, not [(1, 5)]: its prompt and its "
        "output so far (5 tokens) are prefilled again")
    outs = _run(llm)
    assert outs[1].num_preemptions == 1, (
        f"request 1 reports {outs[1].num_preemptions} preemptions, not 1")


@pytest.mark.points(1)
def test_a_readmitted_request_past_its_prompt_still_gets_chunks(impl):
    """A re-admitted request whose recompute was cut by the budget gets its remaining tokens in
    the next step (capped by the budget), not one token as a decode would."""
    llm = _llm(impl, num_blocks=3, block_size=4, budget=3)
    llm.add_request([1, 2, 3, 4], impl.SamplingParams(max_tokens=5))
    llm.add_request([5], impl.SamplingParams(max_tokens=7))
    batches = _steps(llm, 8)
    assert batches[6] == [(1, 3)] and batches[7] == [(1, 2)], (
        f"steps 6 and 7 scheduled {batches[6]} and {batches[7]}, not [(1, 3)] and [(1, 2)]: "
        "request 1 (5 tokens to recompute) is re-admitted with a 3-token chunk, then gets its "
        "remaining 2 tokens: a running request's chunk is its uncomputed tokens, capped by the "
        "budget, whether or not they are past its prompt")


@pytest.mark.points(1)
def test_full_blocks_are_cached_as_soon_as_they_are_computed(impl):
    """A full block enters the prefix cache in the step that computes it, whether that step
    samples or only prefills a chunk, and whether its tokens are prompt or output: a new
    request then hits it."""
    llm = _llm(impl, num_blocks=8, block_size=4, budget=4)
    llm.add_request(list(range(30, 39)), impl.SamplingParams(max_tokens=3))
    llm.step()
    llm.step()  # two 4-token chunks: 2 full blocks computed, nothing sampled yet
    second = llm.add_request(list(range(30, 38)) + [99], impl.SamplingParams(max_tokens=1))
    finished = {out.seq_id: out for out in llm.step()}  # request 1 finishes in this step
    got = (_batch(llm), finished[second].num_cached_prompt_tokens)
    assert got == ([(0, 1), (1, 1)], 8), (
        f"(batch, request 1's cached tokens) = {got}, not ([(0, 1), (1, 1)], 8): request 0's "
        "2 full prompt blocks were computed by chunks that sampled nothing; cache them in "
        "update() for every scheduled request, not only those that sampled")

    llm = _llm(impl, num_blocks=8, block_size=4)
    first = llm.add_request([1, 2, 3], impl.SamplingParams(max_tokens=6))
    llm.step()
    llm.step()  # block 0 = the prompt + 1 output token, now computed
    follow_up = [1, 2, 3] + llm.sequences[first].output_token_ids[:2]
    second = llm.add_request(follow_up, impl.SamplingParams(max_tokens=1))
    finished = {out.seq_id: out for out in llm.step()}
    got = (_batch(llm), finished[second].num_cached_prompt_tokens)
    assert got == ([(0, 1), (1, 1)], 4), (
        f"(batch, cached tokens of a prompt that continues request 0's sequence) = {got}, not "
        "([(0, 1), (1, 1)], 4): request 0's first block holds its prompt and its first output "
        "token; once computed it is cached like any full block")


@pytest.mark.points(1)
def test_a_readmitted_request_hits_blocks_that_hold_outputs(impl):
    """match_prefix walks the leading full blocks of the whole sequence: a re-admitted request
    whose outputs are in blocks another request still holds reuses them too."""
    llm = _llm(impl, num_blocks=5, block_size=4)
    for _ in range(2):  # identical prompts: greedy decoding gives identical outputs
        llm.add_request([1, 2, 3, 4, 5], impl.SamplingParams(max_tokens=8))
    batches = _steps(llm, 6)
    assert batches[5] == [(0, 1), (1, 1)], (
        f"request 1's re-admission scheduled {batches[5]}, not [(0, 1), (1, 1)]: its 9 tokens' "
        "first 2 full blocks (prompt and outputs) are held by request 0 and cached, so only its "
        "last token is computed — match all full blocks of seq's tokens, not only the prompt's")
    outs = _run(llm)
    assert outs[1].num_cached_prompt_tokens == 8, (
        f"request 1 reports {outs[1].num_cached_prompt_tokens} cached tokens, not 8")


@pytest.mark.points(1)
def test_counters_follow_their_docstrings_through_preemption(impl):
    """``num_cached_prompt_tokens`` is set at each admission (the latest one counts, not a sum);
    ``first_token_step`` keeps the step of the first sample across a preemption;
    ``peak_num_used_blocks`` counts the blocks in use right after a schedule, including one a
    request takes in the step it finishes."""
    llm = _llm(impl, num_blocks=4, block_size=2, budget=5)
    for _ in range(2):
        llm.add_request([210, 120, 44], impl.SamplingParams(max_tokens=5))
    outs = _run(llm)
    assert outs[1].num_cached_prompt_tokens == 0, (
        f"request 1 reports {outs[1].num_cached_prompt_tokens} cached tokens, not 0: it hit 2 "
        "cached tokens at its first admission but none at its latest; assign, do not add")

    llm = _llm(impl, num_blocks=3, block_size=4)
    for prompt in ([1, 2, 3, 4], [5, 6, 7, 8]):
        llm.add_request(prompt, impl.SamplingParams(max_tokens=5))
    _steps(llm, 6)  # request 1: first token in step 0, preempted in step 1, back in step 5
    # NOTE: read while request 1 is still running: a finished request leaves llm.sequences.
    step = llm.sequences[1].first_token_step
    assert step == 0, (
        f"request 1's first_token_step = {step}, not 0: it sampled its first token in step 0; "
        "its preemption and re-admission must not reset it")

    llm = _llm(impl, num_blocks=4, block_size=4)
    llm.add_request([1, 2, 3, 4], impl.SamplingParams(max_tokens=2))
    _run(llm)
    assert llm.stats["peak_num_used_blocks"] == 2, (
        f"peak_num_used_blocks = {llm.stats['peak_num_used_blocks']}, not 2: the last decode took "
        "a 2nd block and finished in the same step; read the blocks in use right after "
        "schedule(), before update() frees them")


@pytest.mark.points(1)
def test_prefix_caching_off_means_no_hit(impl):
    """With ``enable_prefix_caching=False`` a request whose first 2 blocks another request has
    computed hits nothing: ``num_cached_prompt_tokens`` and the hit counters stay 0."""
    llm = impl.LLM(paged_model(), num_blocks=16, block_size=4, enable_prefix_caching=False)
    prompt = list(range(30, 39))
    llm.add_request(prompt, impl.SamplingParams(max_tokens=4))
    llm.step()
    seq_id = llm.add_request(prompt[:8] + [99], impl.SamplingParams(max_tokens=2))
    llm.step()
    got = (llm.sequences[seq_id].num_cached_prompt_tokens, llm.stats["num_prefix_hit_tokens"])
    assert got == (0, 0), (
        f"(num_cached_prompt_tokens, num_prefix_hit_tokens) = {got} with prefix caching off, not "
        "(0, 0): with enable_prefix_caching=False, match nothing and register nothing")


@pytest.mark.points(1)
def test_queried_tokens_count_a_readmitted_request_s_outputs(impl):
    """``num_queried_tokens`` adds every token a request holds at each admission: after a
    preemption, its prompt and the tokens it had generated (here 5 + 5 + 9 = 19)."""
    llm = _llm(impl, num_blocks=5, block_size=4)
    for _ in range(2):
        llm.add_request([1, 2, 3, 4, 5], impl.SamplingParams(max_tokens=8))
    _run(llm)
    got = (llm.stats["num_preemptions"], llm.block_manager.num_queried_tokens,
           llm.stats["num_prefix_hit_tokens"])
    assert got == (1, 19, 8), (
        f"(preemptions, num_queried_tokens, num_prefix_hit_tokens) = {got}, not (1, 19, 8): the "
        "preempted request is queried again with its prompt and its 4 outputs (9 tokens), not "
        "its prompt alone")


@pytest.mark.points(1)
def test_an_admission_that_does_not_fit_counts_nothing(impl):
    """``_admit`` returns False *with nothing changed* when the blocks do not fit: a request whose
    prefix hits the cache but whose other blocks are not free adds nothing to the hit or query
    counters while it waits."""
    llm = _llm(impl, num_blocks=4, block_size=4)
    llm.add_request([1, 2, 3, 4, 5], impl.SamplingParams(max_tokens=4))
    llm.add_request([1, 2, 3, 4] + list(range(20, 30)), impl.SamplingParams(max_tokens=1))
    _steps(llm, 2)  # request 1 hits block [1, 2, 3, 4] but needs 3 more blocks: 2 are free
    got = (_waiting(llm), llm.stats["num_prefix_hit_tokens"], llm.block_manager.num_queried_tokens)
    assert got == ([1], 0, 5), (
        f"(waiting, num_prefix_hit_tokens, num_queried_tokens) = {got}, not ([1], 0, 5): an "
        "admission that does not fit must change nothing — decide from match_prefix and the "
        "free count first, and only then use_prefix and allocate")


@pytest.mark.points(1)
def test_prefix_hit_tokens_take_no_budget(impl):
    """Tokens a prefix-cache hit covers are not run, so they take none of the step's budget:
    with 8 tokens of budget, two decodes, a request hitting 8 cached tokens (1 to run) and a
    1-token request all fit in one step."""
    llm = _llm(impl, num_blocks=16, block_size=4, budget=8)
    prompt = list(range(30, 39))
    llm.add_request(prompt, impl.SamplingParams(max_tokens=4))
    _steps(llm, 2)
    llm.add_request(prompt[:8] + [99], impl.SamplingParams(max_tokens=2))
    llm.add_request([5], impl.SamplingParams(max_tokens=2))
    llm.step()
    assert _batch(llm) == [(0, 1), (1, 1), (2, 1)], (
        f"the step scheduled {_batch(llm)}, not [(0, 1), (1, 1), (2, 1)]: request 1's 8 cached "
        "tokens are not run and take no budget; subtract only the tokens scheduled")


@pytest.mark.points(1)
def test_peak_counts_a_shared_block_once(impl):
    """``peak_num_used_blocks`` counts blocks in use (``num_blocks - num_free_blocks``): a block
    two requests share through the prefix cache is one block, not one per holder."""
    llm = _llm(impl, num_blocks=16, block_size=4)
    prompt = list(range(30, 39))
    llm.add_request(prompt, impl.SamplingParams(max_tokens=2))
    llm.step()
    llm.add_request(prompt[:8] + [99], impl.SamplingParams(max_tokens=1))
    llm.step()
    assert llm.stats["peak_num_used_blocks"] == 4, (
        f"peak_num_used_blocks = {llm.stats['peak_num_used_blocks']}, not 4: request 1 shares "
        "request 0's 2 full blocks; count the blocks in use, not the table entries")


@pytest.mark.points(1)
def test_victims_of_one_step_wait_in_their_admission_order(impl):
    """Two requests preempted in one step each go to the front as they are preempted (the
    newest first), so they wait in the order they had been admitted."""
    llm = _llm(impl, num_blocks=3, block_size=4)
    for prompt in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        llm.add_request(prompt, impl.SamplingParams(max_tokens=3))
    _steps(llm, 2)  # step 1: request 0's decode needs a block: requests 2, then 1, preempted
    got = (llm.stats["num_preemptions"], _waiting(llm))
    assert got == (2, [1, 2]), (
        f"(preemptions, waiting) = {got}, not (2, [1, 2]): request 2 is preempted first and goes "
        "to the front, then request 1 goes to the front ahead of it (appendleft each victim as "
        "it is preempted)")
