"""Lab 5, hidden launch-path tests, CPU-OK (instructor-only; run at grading, never released).

The plan with odd tile sizes and GQA groups the public tests do not use (3 and 5 rows per
token, block_n 48 and 100), limits on both sides (a context that exactly fills its table row),
and ALiBi slopes of the wrong dtype or length. All tensors are on the CPU: a valid batch gets
as far as the device check and fails only there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab05_prefill_kernels._cases import KERNELS, launcher, make_batch
from reference.errors import DeviceMismatchError


def cu_of(q_lens):
    return np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)


@pytest.mark.points(1)
@pytest.mark.parametrize("rows_per_token, block_m, block_n", [(3, 64, 48), (5, 32, 100),
                                                              (1, 7, 64)])
def test_hidden_plan_with_odd_groups_and_tile_sizes(impl, rows_per_token, block_m, block_n):
    """rows_per_token 3 and 5, block_m 7 and 32, block_n 48 and 100: every (sequence, row) is
    covered exactly once and each tile visits exactly the KV tiles up to its last row's key
    history + token (causal), counted in block_n tiles rounded up."""
    q_lens, hist = [1, 0, 41, 64, 3], [47, 5, 0, 100, 96]
    ctx = np.asarray([q + h for q, h in zip(q_lens, hist)], dtype=np.int32)
    plan = impl.plan_query_tiles(cu_of(q_lens), ctx, rows_per_token=rows_per_token,
                                 block_m=block_m, block_n=block_n)
    seen = []
    for (s, row0), n in zip(plan.work.tolist(), plan.num_kv_tiles.tolist()):
        num_rows = q_lens[s] * rows_per_token
        last_row = min(row0 + block_m, num_rows) - 1
        seen += [(s, r) for r in range(row0, last_row + 1)]
        want = (hist[s] + last_row // rows_per_token) // block_n + 1
        assert n == want, (f"tile (seq {s}, row {row0}) visits {n} KV tiles of {block_n}, expected "
                           f"{want}: its last row is token {last_row // rows_per_token} after "
                           f"{hist[s]} tokens of history")
    want_rows = {(s, r) for s, q in enumerate(q_lens) for r in range(q * rows_per_token)}
    assert len(seen) == len(set(seen)) and set(seen) == want_rows, (
        "the tiles must cover each (sequence, row) exactly once (last partial tile rounded up, "
        "empty sequences without a tile)")


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", KERNELS)
def test_hidden_context_that_exactly_fills_the_table_is_accepted(impl, kernel):
    """A sequence whose context is exactly max_blocks_per_seq * block_size keys is legal (the
    batch reaches the device check); one key more than its table holds is refused."""
    batch = make_batch(551, [5, 3], [27, 0], 4, 2, 64, 8, device="cpu")
    table = batch["block_tables"]
    assert int(batch["context_lens"][0]) == 32 and (table[0] >= 0).sum() == 4
    batch["block_tables"] = table[:, :4].contiguous()  # width 4 x 8 = 32 keys: exactly full
    try:
        launcher(impl, kernel)(**batch)
    except DeviceMismatchError:
        pass
    except ValueError as exc:
        raise AssertionError(f"{kernel} refused a context that exactly fills its table row "
                             f"(32 = 4 x 8 keys): {exc} — the limit is inclusive") from None
    batch["context_lens"] = batch["context_lens"].clone()
    batch["context_lens"][0] = 33
    with pytest.raises(ValueError, match="context_lens|history|block_tables"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", KERNELS)
def test_hidden_alibi_slopes_of_the_wrong_dtype_or_length(impl, kernel):
    """ALiBi slopes in float64 are a TypeError, and 7 slopes for 8 query heads a ValueError,
    both naming alibi_slopes (the kernel reads exactly num_q_heads float32 values)."""
    batch = make_batch(561, [4, 2], [3, 9], 8, 2, 64, 16, alibi=True, device="cpu")
    slopes = batch["alibi_slopes"]
    with pytest.raises(TypeError, match="alibi_slopes"):
        launcher(impl, kernel)(**dict(batch, alibi_slopes=slopes.to(torch.float64)))
    with pytest.raises(ValueError, match="alibi_slopes"):
        launcher(impl, kernel)(**dict(batch, alibi_slopes=slopes[:7].contiguous()))
