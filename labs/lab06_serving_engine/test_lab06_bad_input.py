"""Lab 6: bad requests get typed errors naming the argument, and the engine stays usable."""

from __future__ import annotations

import pytest

from labs.lab06_serving_engine._cases import BLOCK_SIZE, hf_tokens, paged_model, random_prompts
from reference.errors import SequenceTooLongError


@pytest.mark.points(2)
def test_bad_sampling_params_are_refused(impl):
    """max_tokens must be an int >= 1, temperature a finite real >= 0 (a bool is not a number,
    infinity is not finite), seed an int or None; each refusal names the field."""
    cases = [({"max_tokens": 0}, ValueError, "max_tokens"), ({"max_tokens": 2.0}, TypeError, "max_tokens"),
             ({"max_tokens": True}, TypeError, "max_tokens"), ({"temperature": -0.5}, ValueError, "temperature"),
             ({"temperature": float("nan")}, ValueError, "temperature"),
             ({"temperature": float("inf")}, ValueError, "temperature"),
             ({"temperature": True}, TypeError, "temperature"),
             ({"temperature": "0"}, TypeError, "temperature"), ({"seed": 1.5}, TypeError, "seed")]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name):
            impl.SamplingParams(**kwargs)
    assert impl.SamplingParams(max_tokens=3, temperature=0.7, seed=1).temperature == 0.7


@pytest.mark.points(3)
def test_bad_prompts_are_refused_and_the_engine_stays_usable(impl):
    """An empty prompt, a negative token id or one at or past the vocabulary size, a non-int
    token (``True`` included), a request longer than the pool can ever hold, and a list of sampling params shorter
    or longer than the prompts are refused before anything is queued; the same engine then
    serves a good batch with transformers' tokens."""
    llm = impl.LLM(paged_model(), num_blocks=6, block_size=BLOCK_SIZE)  # holds 24 tokens
    params = impl.SamplingParams(max_tokens=4)
    good = random_prompts((5, 7), seed=9)
    # NOTE: -1, 256 (= vocab_size) and 400: a range check must bound both ends, each exactly,
    # not only test equality with vocab_size.
    bad = [([], ValueError, r"prompts\[1\]"), ([3, -1], ValueError, r"prompts\[1\]"),
           ([3, 256], ValueError, r"prompts\[1\]"), ([3, 400], ValueError, r"prompts\[1\]"),
           ([3, "4"], TypeError, r"prompts\[1\]"), ([3, True], TypeError, r"prompts\[1\]"),
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


@pytest.mark.points(1)
def test_integer_tokens_of_numpy_and_torch_are_accepted_as_ints(impl):
    """Token ids follow the workbook's integer rule: NumPy and torch integers are ints (taken
    as plain ints), so such a prompt generates what the same prompt of Python ints does."""
    import numpy as np
    import torch

    llm = impl.LLM(paged_model(), num_blocks=8, block_size=BLOCK_SIZE)
    prompt = random_prompts((5,), seed=4)[0]
    params = impl.SamplingParams(max_tokens=3)
    want = llm.generate([prompt], params)[0].output_token_ids
    for kind, tokens in (("NumPy", [np.int64(t) for t in prompt]),
                         ("torch", [torch.tensor(t) for t in prompt])):
        try:
            got = llm.generate([tokens], params)[0].output_token_ids
        except TypeError as exc:
            pytest.fail(f"a prompt of {kind} integers was refused ({exc}): the workbook's rule "
                        "(reference.checks.check_int) accepts NumPy and torch integers")
        assert got == want, f"a prompt of {kind} integers generated {got}, its ints {want}"


@pytest.mark.points(1)
def test_a_refused_request_takes_no_seq_id(impl):
    """check before changing anything: a request refused by ``add_request`` leaves
    ``next_seq_id`` alone, so the next good request gets the id the refused one would have."""
    llm = impl.LLM(paged_model(), num_blocks=6, block_size=BLOCK_SIZE)
    for bad in ([], [3, -1]):
        with pytest.raises(ValueError):
            llm.add_request(bad, impl.SamplingParams())
    assert llm.next_seq_id == 0, (
        f"next_seq_id = {llm.next_seq_id} after two refused requests, not 0: check the request "
        "before taking an id")
    assert llm.add_request([1, 2], impl.SamplingParams(max_tokens=2)) == 0


@pytest.mark.points(1)
def test_max_model_len_bounds_a_request_below_the_pool(impl):
    """``max_model_len`` set below what the pool holds is the limit: a request of prompt +
    max_tokens one past it is refused (SequenceTooLongError), one exactly at it is accepted."""
    llm = impl.LLM(paged_model(), num_blocks=6, block_size=4, max_model_len=10)  # pool: 24
    with pytest.raises(SequenceTooLongError, match="max_model_len"):
        llm.add_request([1] * 8, impl.SamplingParams(max_tokens=3))
    assert not llm.has_unfinished_requests(), "a refused request was queued"
    assert llm.add_request([1] * 8, impl.SamplingParams(max_tokens=2)) == 0


@pytest.mark.points(1)
def test_a_step_with_nothing_to_schedule_raises(impl):
    """``step()`` on an engine with no request raises RuntimeError (its docstring): it never
    returns an empty list, which a caller's loop would spin on."""
    llm = impl.LLM(paged_model(), num_blocks=6, block_size=4)
    try:
        result = llm.step()
    except NotImplementedError:
        raise  # NOTE: a RuntimeError too: the untouched starter must fail here with its TODO
    except RuntimeError:
        return
    pytest.fail(f"step() with no request returned {result!r}; its docstring says RuntimeError")
