"""Lab 6: bad requests get typed errors naming the argument, and the engine stays usable."""

from __future__ import annotations

import pytest

from labs.lab06_serving_engine._cases import BLOCK_SIZE, hf_tokens, paged_model, random_prompts
from reference.errors import SequenceTooLongError


@pytest.mark.points(2)
def test_bad_sampling_params_are_refused(impl):
    """max_tokens must be an int >= 1, temperature a finite real >= 0, seed an int or None; each
    refusal names the field."""
    cases = [({"max_tokens": 0}, ValueError, "max_tokens"), ({"max_tokens": 2.0}, TypeError, "max_tokens"),
             ({"max_tokens": True}, TypeError, "max_tokens"), ({"temperature": -0.5}, ValueError, "temperature"),
             ({"temperature": float("nan")}, ValueError, "temperature"),
             ({"temperature": "0"}, TypeError, "temperature"), ({"seed": 1.5}, TypeError, "seed")]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name):
            impl.SamplingParams(**kwargs)
    assert impl.SamplingParams(max_tokens=3, temperature=0.7, seed=1).temperature == 0.7


@pytest.mark.points(3)
def test_bad_prompts_are_refused_and_the_engine_stays_usable(impl):
    """An empty prompt, a negative token id or one at or past the vocabulary size, a non-int
    token, a request longer than the pool can ever hold, and a list of sampling params shorter
    or longer than the prompts are refused before anything is queued; the same engine then
    serves a good batch with transformers' tokens."""
    llm = impl.LLM(paged_model(), num_blocks=6, block_size=BLOCK_SIZE)  # holds 24 tokens
    params = impl.SamplingParams(max_tokens=4)
    good = random_prompts((5, 7), seed=9)
    # NOTE: -1, 256 (= vocab_size) and 400: a range check must bound both ends, each exactly,
    # not only test equality with vocab_size.
    bad = [([], ValueError, r"prompts\[1\]"), ([3, -1], ValueError, r"prompts\[1\]"),
           ([3, 256], ValueError, r"prompts\[1\]"), ([3, 400], ValueError, r"prompts\[1\]"),
           ([3, "4"], TypeError, r"prompts\[1\]"),
           ([1] * 21, SequenceTooLongError, r"prompts\[1\]")]
    for prompt, error, name in bad:
        with pytest.raises(error, match=name):
            llm.generate([good[0], prompt], params)
        assert not llm.has_unfinished_requests() and llm.block_manager.num_free_blocks == 6, (
            f"after refusing {prompt!r:.40} the engine still queues requests or holds blocks: "
            "check every request before queuing any")
    with pytest.raises(TypeError, match="sampling_params"):
        llm.generate(good, {"max_tokens": 4})
    for num_params in (len(good) - 1, len(good) + 1):  # one per prompt: not fewer, not more
        with pytest.raises(ValueError, match="sampling_params"):
            llm.generate(good, [params] * num_params)
        assert not llm.has_unfinished_requests(), (
            f"{num_params} sampling params for {len(good)} prompts queued requests")
    outs = llm.generate(good, params)
    assert [o.output_token_ids for o in outs] == hf_tokens(good, 4), (
        "after refused requests the engine no longer generates transformers' tokens")
