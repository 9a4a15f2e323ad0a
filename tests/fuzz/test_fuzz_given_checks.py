"""Bad-input fuzz of the validation students are *given*: ``reference/checks.py``, Lab 3's
``_checks.py``, Lab 2's ``_pool.py``, and the given functions of the Lab 3 starter (the code a
student calls but does not write). Same contract: a documented error naming the argument;
integer-like scalars become Python ints; nothing else is coerced."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import reference.checks as rc
from _fuzz_harness import NON_INTEGERS, accepted, fuzz_settings, integer_like, refused
from labs.lab02_kv_cache_pool import _pool as lab2_pool
from labs.lab03_paged_attention_oracle import _checks as lab3_checks
from reference.loader import load_impl

pytestmark = pytest.mark.fuzz


@fuzz_settings()
@given(bad=NON_INTEGERS, name=st.sampled_from(["block_id", "n", "seq_id", "token_ids[3]"]))
def test_integer_checks_refuse_non_integers_and_name_them(bad, name):
    for call in (lambda: rc.check_int(name, bad), lambda: rc.check_index(name, bad, 10),
                 lambda: rc.check_block_hash(name, bad),
                 lambda: rc.check_int_list(name, [1, bad])):
        refused(call, names=(name,), what=f"a check of {bad!r}")


@fuzz_settings()
@given(data=st.data())
def test_integer_checks_accept_integer_likes_as_python_ints(data):
    value = data.draw(st.integers(0, 9))
    like = data.draw(integer_like(value))
    for check in (lambda v: rc.check_int("x", v), lambda v: rc.check_index("x", v, 10),
                  lambda v: rc.check_block_hash("x", v)):
        got = accepted(lambda: check(like), what=f"check of {like!r}")
        assert got == value and type(got) is int, f"{like!r} became {got!r}"
    got = rc.check_int_list("xs", np.array([value, value], dtype=np.int32))
    assert got == [value, value] and all(type(v) is int for v in got)
    refused(lambda: rc.check_index("x", value + 10, 10), names=("x",), what="out of range")
    refused(lambda: rc.check_int("x", -1 - value, min_value=0), names=("x",), what="below min")


@fuzz_settings()
@given(bad=st.one_of(st.sampled_from(["0.5", None, True, np.True_, 1j, [1.0], torch.tensor(1.0),
                                      float("nan"), float("inf"), 0.0, -2.0, 10**400, 1e-400]),
                     st.floats(max_value=0.0)),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_scale_check_refuses_non_finite_or_non_positive_in_its_dtype(bad, dtype):
    refused(lambda: rc.check_scale(bad, dtype=dtype), names=("scale",), what=f"scale={bad!r}")


@fuzz_settings(0.5)
@given(scale=st.sampled_from([1e39, 3.5e38, 1e-46, 1e-50]))
def test_float32_scale_check_refuses_what_float32_cannot_hold(scale):
    refused(lambda: rc.check_scale(scale, dtype=np.float32), names=("scale",), what=str(scale))
    assert rc.check_scale(scale) == scale  # fine as float64


@fuzz_settings()
@given(bad=st.sampled_from([None, "ab", [[1, 2], [3]], [1.5, 2.0], np.array([True]),
                            torch.tensor([1, 2]), object(), {1: 2},
                            np.array([2**64 - 1], dtype=np.uint64)]))
def test_array_checks_name_their_argument(bad):
    refused(lambda: rc.check_int_array("block_tables", bad, 1, "[n]"), names=("block_tables",),
            what=f"check_int_array({bad!r:.40})")
    refused(lambda: rc.check_float_array("query", bad, 1, "[n]"), names=("query",),
            what=f"check_float_array({bad!r:.40})")


@fuzz_settings()
@given(data=st.data())
def test_lab3_state_checks_name_their_argument(data):
    m, l, acc = np.zeros(2), np.ones(2), np.zeros((2, 3))
    bad = data.draw(st.sampled_from([None, 1, "x", [0.0, 0.0], np.zeros(2, int), torch.zeros(2),
                                     np.zeros(3)]))
    which = data.draw(st.sampled_from(["m", "l", "acc"]))
    args = {"m": m, "l": l, "acc": acc, which: bad}
    refused(lambda: lab3_checks.check_state(**args), names=(which, "state"),
            what=f"check_state({which}={bad!r:.30})")
    refused(lambda: lab3_checks.check_lead_shape(data.draw(st.sampled_from(
        [None, 3, (2.0,), (-1,), "ab", [True]]))), names=("lead_shape",), what="lead_shape")


@fuzz_settings(0.5)
@given(data=st.data())
def test_lab2_given_helpers(data):
    cases = [
        (lambda: lab2_pool._check_device(data.draw(st.sampled_from(
            ["nope", 3.5, None, "cuda:99" if torch.cuda.is_available() else "cuda"]))),
         ("device",)),
        (lambda: lab2_pool._check_block_manager(data.draw(st.sampled_from(
            [object(), 5, "bm", None])), 4), ("block_manager",)),
        (lambda: lab2_pool._check_dtype(data.draw(st.sampled_from(
            [np.float16, "float16", torch.int32, None]))), ("dtype",)),
        (lambda: lab2_pool._check_tensor("key", data.draw(st.sampled_from(
            [None, np.zeros(2), [1.0]])), torch.device("cpu")), ("key",)),
        (lambda: lab2_pool._check_tensor("value", torch.zeros(2, device="meta"),
                                       torch.device("cpu")), ("value",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, what="a Lab 2 given helper")


@fuzz_settings(0.5)
@given(data=st.data())
def test_lab3_starter_round_to(data):
    starter = load_impl("lab03_paged_attention_oracle", "starter")
    refused(lambda: starter.round_to(data.draw(st.sampled_from(
        [None, "x", torch.zeros(2), [[1.0], [2.0, 3.0]], np.array([True])])), "float16"),
        names=("x",), what="round_to(bad x)")
    refused(lambda: starter.round_to(np.ones(2), data.draw(st.sampled_from(
        ["fp16", None, np.float16, "float32"]))), names=("dtype",), what="round_to(bad dtype)")
    x = np.array(data.draw(st.lists(st.floats(-6e4, 6e4), min_size=1, max_size=4)))
    out = starter.round_to(x, data.draw(st.sampled_from(["float16", "bfloat16"])))
    assert np.isfinite(out).all(), "round_to of finite float16-range values must be finite"
