"""Lab 4, hidden launch-path tests, CPU-OK (instructor-only; run at grading, never released).

Limits on both sides (a context that exactly fills its table row and one token more; a forced
plan that exactly covers max_context_len and one that falls a token short), split plans for
GPU sizes and contexts the public tests do not use, and heads_per_cta for groups past 8. The
inputs are CPU tensors: a valid batch gets as far as the device check and fails only there.
"""

from __future__ import annotations

import pytest
import torch

from reference.errors import DeviceMismatchError
from reference.layout import PAD_BLOCK_ID

VERSIONS = ["naive", "v0", "v1", "v2", "v3", "v4", "v5", "v6"]


def full_table_batch(block_size=8, width=3, num_seqs=2):
    """A CPU batch of head size 64 whose sequence 0 exactly fills its table row."""
    query = torch.zeros(num_seqs, 4, 64, dtype=torch.bfloat16)
    key_cache = torch.zeros(num_seqs * width + 1, 2, block_size, 64, dtype=torch.bfloat16)
    block_tables = torch.full((num_seqs, width), PAD_BLOCK_ID, dtype=torch.int32)
    block_tables[0] = torch.arange(width, dtype=torch.int32)
    block_tables[1, 0] = width
    context_lens = torch.tensor([width * block_size, 1] + [0] * (num_seqs - 2), dtype=torch.int32)
    return dict(query=query, key_cache=key_cache, value_cache=key_cache.clone(),
                block_tables=block_tables, context_lens=context_lens)


@pytest.mark.points(1)
@pytest.mark.parametrize("version", VERSIONS)
def test_hidden_context_that_exactly_fills_the_table_is_accepted(impl, version):
    """context_lens[0] == max_blocks_per_seq * block_size (24 = 3 x 8) is legal: the batch gets
    to the device check; one token more is a ValueError naming context_lens[0]."""
    batch = full_table_batch()
    try:
        impl.KERNELS[version](**batch)
    except DeviceMismatchError:
        pass
    except ValueError as exc:
        raise AssertionError(
            f"{version} refused a context of exactly max_blocks_per_seq * block_size = 24 tokens "
            f"({exc}): the limit is inclusive (> instead of >=?)") from None
    batch["context_lens"][0] = 25
    with pytest.raises(ValueError, match=r"context_lens\[0\]"):
        impl.KERNELS[version](**batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6"])
def test_hidden_forced_plan_that_exactly_covers_is_accepted(impl, version):
    """A plan of 3 x 64 = 192 tokens covers max_context_len=192 exactly (accepted: the batch
    reaches the device check); max_context_len=193 is one token too many (a ValueError naming
    the plan)."""
    batch = full_table_batch(block_size=32, width=6)
    plan = impl.SplitKVPlan(3, 64)
    with pytest.raises(DeviceMismatchError):
        impl.KERNELS[version](**batch, plan=plan, max_context_len=192)
    with pytest.raises(ValueError, match="plan"):
        impl.KERNELS[version](**batch, plan=plan, max_context_len=193)


@pytest.mark.points(1)
@pytest.mark.parametrize("num_seqs, num_kv_heads, max_len, num_sms", [
    (1, 1, 1, 7), (1, 1, 1025, 7), (3, 1, 4096, 10), (2, 3, 2048, 100), (1, 1, 70_000, 1),
])
def test_hidden_split_plan_covers_odd_gpus_and_lengths(impl, num_seqs, num_kv_heads, max_len,
                                                       num_sms):
    """For SM counts 1, 7, 10, 100 and contexts 1, 1025, 70000: the plan covers max_len with
    partitions that are multiples of 64, never longer than the cap, and with no partition that
    starts past the longest context."""
    plan = impl.plan_split_kv(num_seqs, num_kv_heads, max_len, num_sms)
    n, size = plan.num_partitions, plan.partition_size
    assert isinstance(n, int) and isinstance(size, int), f"plan fields must be ints: {plan}"
    assert n >= 1 and n * size >= max_len, f"{plan} does not cover {max_len} tokens"
    assert size % 64 == 0 and 64 <= size <= impl.MAX_PARTITION_SIZE, (
        f"{plan}: partitions must be whole multiples of 64 up to {impl.MAX_PARTITION_SIZE}")
    assert (n - 1) * size < max_len, f"{plan}: its last partition starts past {max_len} tokens"


@pytest.mark.points(1)
@pytest.mark.parametrize("group, want", [(10, 5), (24, 8), (7, 7), (9, 3), (96, 8)])
def test_hidden_heads_per_cta_for_groups_past_8(impl, group, want):
    """The largest divisor of the group that is at most 8: 10 -> 5, 24 -> 8, 7 -> 7, 9 -> 3."""
    got = impl.heads_per_cta(group)
    assert got == want, (f"heads_per_cta({group}) = {got}, expected {want}: a CTA's heads must "
                         "all share one KV head (a divisor of the group), as many as fit in 8")
