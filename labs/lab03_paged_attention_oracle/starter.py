"""Lab 3 — the NumPy paged-attention oracle: online softmax over pages, prefill and split-K.

These functions are the *semantics* the CUDA kernels of Labs 4 and 5 reproduce, written so that
each line maps to a line of a kernel: stream a sequence's logical blocks through its block table,
keep a running softmax state, read only the rows that hold tokens.

The attention state of one query (one head) over a set of keys with scores ``s_t`` and values
``v_t`` is the triple

    m   = max_t s_t                        running max              [...]
    l   = sum_t exp(s_t - m)               softmax denominator      [...]
    acc = sum_t exp(s_t - m) * v_t         unnormalised output      [..., head_size]

from which ``out = acc / l`` and ``lse = m + log(l)``. Every function below either grows a state
by one block (online softmax), merges states (split-K), or turns a state into ``(out, lse)``.

Semantics shared with ``reference/oracle.py`` (Labs 4–5 implement the same):
  * GQA: query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)``.
  * Causal with history: in a sequence with ``context_len`` keys whose last ``q_len`` tokens are
    the queries, query ``i`` sees keys ``0 .. context_len - q_len + i``. A decode query is the
    last token and sees every key.
  * ALiBi: ``score += slope[h] * (key_pos - query_pos)``, never positive under causal masking.
  * Zero length: a query that sees no key has output exactly 0 and lse -inf. That is the *empty
    state* ``(m, l, acc) = (-inf, 0, 0)``, the identity of the split-K merge.

NaN/inf contract (Labs 4–5 keep the same one): arguments are checked — shapes, dtypes, ids,
lengths, and a ``scale`` and ALiBi slopes that must be finite — but the *data* (query, keys,
values) is not scanned: that would cost a pass over the whole cache, which also holds garbage
(NaN in our tests) where no token lives. Non-finite data propagates instead: a NaN or ±inf in
a query, or in a key row that query reads, makes that query's ``out`` and ``lse`` non-finite
(NaN or ±inf); in a value row it reads, its ``out`` (``lse`` depends only on the scores) —
never a finite wrong number. (A score of -inf computed from data is
turned into NaN, so an infinite key is never mistaken for a masked one.) Rows a query does not
read — past ``context_len``, in unused blocks, behind PAD entries, or causally masked — never
affect it. From finite data and a finite scale the results are finite (lse is -inf only for a
query that sees no key).

Your tasks are marked ``TODO(lab3.k)``; ``LAB_IMPL=starter pagedlab grade 3`` lists the ones left.
The argument checks in ``_checks.py`` are given: call them first, so bad input is refused with a
typed error before anything is computed. ``_numerics.py`` gives two numerics helpers you call:
``_data_neg_inf_to_nan`` (every score, before masking) and ``round_to`` (Task 5's fp16/bf16
rounding, which the tests also call as this module's ``round_to``).
"""

from __future__ import annotations

import numpy as np

from labs.lab03_paged_attention_oracle._checks import (  # noqa: F401  (you will want all of them)
    check_alibi_slopes,
    check_block_scores,
    check_block_tables,
    check_cu_seqlens,
    check_dense_inputs,
    check_float_array,
    check_float_dtype,
    check_head_size,
    check_heads,
    check_int,
    check_kv_cache,
    check_lead_shape,
    check_out_lse,
    check_partitions,
    check_scale,
    check_state,
    check_values_array,
)
from labs.lab03_paged_attention_oracle._numerics import (  # given: see _numerics.py
    LOW_PRECISION_DTYPES,
    _data_neg_inf_to_nan,
    round_to,
)
from reference.layout import num_blocks_for  # noqa: F401  (ceil(num_tokens / block_size))


# --------------------------------------------------------------------------------------------
# Task 1: the slow truth.
# --------------------------------------------------------------------------------------------
def dense_attention(q, k, v, scale: float, *, causal: bool = True, alibi_slopes=None):
    """Dense attention for one sequence in float64: the full score matrix, then softmax.

    Args:
        q: [q_len, num_q_heads, head_size] — the queries are the *last* q_len positions of the
            sequence (position ``kv_len - q_len + i`` for query ``i``).
        k: [kv_len, num_kv_heads, head_size]
        v: [kv_len, num_kv_heads, head_size]
        scale: multiplies q·k.
        causal: mask the keys after each query's position (causal with history).
        alibi_slopes: [num_q_heads] or None; adds ``slope[h] * (key_pos - query_pos)``.

    Returns:
        (out, lse): out [q_len, num_q_heads, head_size] and lse [q_len, num_q_heads], float64.
        A query that sees no key gets out 0 and lse -inf.

    Raises:
        TypeError: ``q``, ``k``, ``v`` are not float arrays, ``causal`` is not a bool, or
            ``scale`` / ``alibi_slopes`` are not floats.
        ValueError: bad shapes; ``num_q_heads`` is not a multiple of ``num_kv_heads``; q_len >
            kv_len with ``causal`` (a query would have no position in the sequence); a scale
            that is not finite and > 0 or a slope that is not finite.
    """
    # TODO(lab3.1): the slow truth. Check first: check_dense_inputs (it also casts to float64),
    # check_heads (it raises the ValueError for you), check_scale, check_alibi_slopes. Repeat each KV head group times along the head axis (np.repeat,
    # not np.tile: query head h must read KV head h // group). Form every score with einsum,
    # pass them through _data_neg_inf_to_nan (the NaN/inf contract), add the ALiBi bias, set
    # masked scores to -inf, subtract the row max, exponentiate, normalise. A row that sees no
    # key (all -inf) must give out 0 and lse -inf, not NaN.
    raise NotImplementedError(
        "TODO(lab3.1): dense_attention — float64 softmax(q·k·scale + bias) @ v, causal with "
        "history, GQA"
    )


# --------------------------------------------------------------------------------------------
# Task 2: the online-softmax recurrence and paged decode.
# --------------------------------------------------------------------------------------------
def kv_head_indices(num_q_heads: int, num_kv_heads: int) -> np.ndarray:
    """Returns the KV head each query head reads (GQA / MQA / MHA).

    Args:
        num_q_heads: query heads.
        num_kv_heads: KV heads; must divide ``num_q_heads``.

    Returns:
        [num_q_heads] int64: entry ``h`` is ``h // (num_q_heads // num_kv_heads)`` — consecutive
        query heads share a KV head, as in vLLM's ``kv_head_idx = head_idx / num_queries_per_kv``.

    Raises:
        TypeError: a count is not an int.
        ValueError: ``num_q_heads`` is not a positive multiple of ``num_kv_heads``.
    """
    # TODO(lab3.2): validate with check_heads, then map each query head to its KV head.
    raise NotImplementedError(
        "TODO(lab3.2): "
        "kv_head_indices — query head h reads KV head h // (num_q_heads // num_kv_heads)"
    )


def empty_state(lead_shape, head_size: int, dtype=np.float64):
    """Returns the state of attention over *no* keys: ``(m, l, acc) = (-inf, 0, 0)``.

    It is the identity of :func:`merge_partitions` and what :func:`finalize_state` turns into
    the zero-length result (out 0, lse -inf).

    Args:
        lead_shape: shape of the leading dimensions, e.g. ``(num_q_heads,)``.
        head_size: elements per value vector.
        dtype: float dtype of the state.

    Returns:
        (m, l, acc): [*lead_shape], [*lead_shape], [*lead_shape, head_size].

    Raises:
        TypeError / ValueError: ``lead_shape`` is not a list of ints >= 0, ``head_size`` is not
            an int >= 1, or ``dtype`` is not a float dtype.
    """
    lead_shape = check_lead_shape(lead_shape)
    head_size = check_int("head_size", head_size, min_value=1)
    dtype = check_float_dtype(dtype)
    # TODO(lab3.2): m = -inf, l = 0, acc = 0 in the given dtype.
    raise NotImplementedError("TODO(lab3.2): empty_state — (m, l, acc) = (-inf, 0, 0)")


def online_softmax_update(m, l, acc, scores, values):
    """Grows an attention state by one block of keys: the online-softmax recurrence.

    Args:
        m: [...] running max of the scores seen so far (-inf before the first key).
        l: [...] sum of exp(score - m) so far.
        acc: [..., head_size] sum of exp(score - m) * value so far (not divided by l).
        scores: [..., n] the new block's scores; -inf marks a masked key.
        values: [..., n, head_size] the new block's values; leading dimensions broadcast
            against ``scores``' (e.g. one KV head's values shared by a group of query heads).

    Returns:
        (m, l, acc) after the block, same shapes: a new state; the arrays given are not
        modified (one prefix state may be grown twice). A block whose scores are all -inf leaves
        the state unchanged; nothing here is ever NaN for finite inputs, and a NaN or +inf score
        or a non-finite value propagates into the state (the module's NaN/inf contract).

    Raises:
        TypeError / ValueError: not float arrays, or shapes that do not fit the state.
    """
    check_state(m, l, acc)
    check_block_scores(m, acc, scores, values)
    # TODO(lab3.2): the recurrence. m_new = max(m, block max); correction = exp(m - m_new);
    # p = exp(scores - m_new); l = l * correction + sum(p); acc = acc * correction + p @ values.
    # Guard the empty case: while m_new is still -inf, m - m_new is -inf - -inf = NaN. Subtract
    # a finite stand-in (0) instead; exp(-inf - 0) = 0 is the right weight for "nothing yet".
    raise NotImplementedError(
        "TODO(lab3.2): "
        "online_softmax_update — running max, correction factor, denominator, accumulator"
    )


def finalize_state(m, l, acc):
    """Turns a state into the attention output and its log-sum-exp.

    Args:
        m: [...] running max.
        l: [...] softmax denominator relative to m.
        acc: [..., head_size] unnormalised output.

    Returns:
        (out, lse): out [..., head_size] = acc / l, lse [...] = m + log(l). Where ``l == 0``
        (no key seen) out is exactly 0 and lse is -inf — the zero-length contract.

    Raises:
        TypeError / ValueError: not a state (see :func:`check_state`).
    """
    check_state(m, l, acc)
    # TODO(lab3.2): out = acc / l, lse = m + log(l); where l == 0 return out 0 and lse -inf
    # without ever dividing by zero.
    raise NotImplementedError(
        "TODO(lab3.2): "
        "finalize_state — (out, lse) from (m, l, acc), zero-length safe"
    )


def partition_attention(query, key_cache, value_cache, block_table, context_len: int,
                        scale: float, start_token_idx: int = 0, end_token_idx: int | None = None,
                        alibi_slopes=None, *, compute_dtype=np.float64):
    """Attention state of one sequence's decode query over keys ``[start, end)`` of its pages.

    This is one CTA of a split-K decode kernel (one partition of one sequence, all heads); with
    the default range it is a whole decode. Blocks are streamed in logical order through the
    block table, each through :func:`online_softmax_update`, vectorised over heads and tokens.

    Args:
        query: [num_q_heads, head_size] the sequence's query (its position is context_len - 1).
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_table: [max_blocks_per_seq] the sequence's row of the block table.
        context_len: keys in the sequence.
        scale: multiplies q·k.
        start_token_idx: first key of the partition.
        end_token_idx: one past the last key; None means context_len.
        alibi_slopes: [num_q_heads] or None.
        compute_dtype: float64 for the oracle; Task 5 passes float32.

    Returns:
        (m, l, acc): [num_q_heads], [num_q_heads], [num_q_heads, head_size] in compute_dtype.
        An empty range gives the empty state.

    Raises:
        TypeError / ValueError / IndexError: bad shapes, range or block table (see _checks);
            the range and ``context_len`` must be ints (no silent rounding of 2.7 to 2).
        ValueError: a range outside ``0 <= start_token_idx <= end_token_idx <= context_len``.
    """
    # TODO(lab3.2): validate (check_kv_cache, check_float_array, check_head_size,
    # kv_head_indices, check_float_dtype for compute_dtype, check_int for context_len and the
    # range — never round 2.7 to 2 — (outside 0 <= start <= end <= context_len: ValueError),
    # check_block_tables on the one row as a one-row table (check_values_array(...)[None] with
    # [context_len]), check_alibi_slopes and check_scale *in compute_dtype*: 1e39 is a fine
    # float64 but inf in float32). Then walk the logical blocks that overlap
    # [start_token_idx, end_token_idx):
    # block_id = block_table[logical_block_idx]; read ONLY the rows that hold tokens of the
    # range (the last block is usually partial, and the rest of it is NaN here); gather each
    # query head's KV head; scores = q·k * scale (+ ALiBi with query_pos = context_len - 1);
    # _data_neg_inf_to_nan; online_softmax_update. Work in compute_dtype throughout.
    raise NotImplementedError(
        "TODO(lab3.2): "
        "partition_attention — stream logical blocks through the block table"
    )


def paged_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                 alibi_slopes=None):
    """Decode attention over a paged KV cache (one new token per sequence), in float64.

    The shape of vLLM's ``paged_attention_v1``: one pass per sequence (per CTA), streaming the
    sequence's blocks through its block table with the online softmax.

    Args:
        query: [num_seqs, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        context_lens: [num_seqs] keys per sequence, the current token included (0 allowed).
        scale: multiplies q·k.
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): [num_seqs, num_q_heads, head_size] and [num_seqs, num_q_heads], float64.
        A sequence with context_len 0 gets out 0 and lse -inf.

    Raises:
        TypeError / ValueError / IndexError: bad shapes, head counts or block tables.
    """
    # TODO(lab3.2): validate the batch (shapes, heads, block tables, one query row per table
    # row), then per sequence: finalize_state(partition_attention(...)) over the whole context.
    # Keep the loop body dtype-generic: Task 5 reuses it in float32.
    raise NotImplementedError(
        "TODO(lab3.2): "
        "paged_decode — batched paged decode with the online softmax"
    )


# --------------------------------------------------------------------------------------------
# Task 3: varlen prefill with history (chunked prefill).
# --------------------------------------------------------------------------------------------
def paged_prefill(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                  scale: float, alibi_slopes=None):
    """Causal varlen prefill over a paged cache: new tokens attend to history and to each other.

    Sequence ``s`` owns query rows ``cu_seqlens_q[s] .. cu_seqlens_q[s+1] - 1``; its K/V,
    history and new tokens alike, are already in the cache, so ``context_lens[s]`` is
    ``history_len + q_len``. Query ``i`` of the sequence sits at position
    ``history_len + i`` and sees keys ``0 .. history_len + i``.

    Args:
        query: [total_query_tokens, num_q_heads, head_size], sequences packed back to back.
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        cu_seqlens_q: [num_seqs + 1] int query offsets, cu_seqlens_q[0] == 0.
        context_lens: [num_seqs] keys per sequence (history + new tokens).
        scale: multiplies q·k.
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): [total_query_tokens, num_q_heads, head_size] and
        [total_query_tokens, num_q_heads], float64.

    Raises:
        TypeError / ValueError / IndexError: bad shapes, offsets, head counts or block tables.
    """
    # TODO(lab3.3): validate (check_cu_seqlens too). Per sequence: its query rows
    # cu_seqlens_q[s]:cu_seqlens_q[s+1]; history_len = context_len - q_len; query i may see keys
    # 0 .. history_len + i (inclusive). Stream the sequence's blocks as in decode, but with a
    # state per (head, query): scores [num_q_heads, q_len, n], masked to -inf where a key is in
    # a query's future (after _data_neg_inf_to_nan, so only the mask makes -inf), ALiBi with
    # query_pos = history_len + i. Skip sequences with no queries.
    raise NotImplementedError(
        "TODO(lab3.3): "
        "paged_prefill — varlen, causal with history, GQA, ALiBi"
    )


# --------------------------------------------------------------------------------------------
# Task 4: split-K (flash-decoding): partitions and their merge.
# --------------------------------------------------------------------------------------------
def merge_partitions(m, l, acc):
    """Merges attention states of disjoint key sets into the state of their union.

    Each partition's state is rescaled from its own max to the global max before summing:
    ``w_i = exp(m_i - max_j m_j)``, ``l = sum_i w_i l_i``, ``acc = sum_i w_i acc_i``. Empty
    partitions ``(-inf, 0, 0)`` contribute nothing, even when every partition is empty.

    Args:
        m: [num_partitions, ...] per-partition max.
        l: [num_partitions, ...] per-partition denominator.
        acc: [num_partitions, ..., head_size] per-partition unnormalised output.

    Returns:
        (m, l, acc): [...], [...], [..., head_size] — the merged state.

    Raises:
        TypeError / ValueError: not states with a leading axis of at least one partition.
    """
    check_partitions(m, l, acc)
    # TODO(lab3.4): global max M over the partition axis; weights exp(m_i - M) (guard M = -inf
    # as in the recurrence: all partitions empty must give the empty state, not NaN); weighted
    # sums of l and acc.
    raise NotImplementedError(
        "TODO(lab3.4): "
        "merge_partitions — rescale each partition to the global max, then sum"
    )


def merge_attn_states(out_a, lse_a, out_b, lse_b):
    """Merges two attention results given as (out, lse) — the form kernels write.

    ``(out, lse)`` is the state ``(m, l, acc) = (lse, 1, out)``: same ratio acc / l, same
    log-sum-exp. That is how vLLM's ``merge_attn_states`` and FlashInfer's ``merge_state``
    combine a prefix and a suffix, or the partitions of a split-K kernel.

    Args:
        out_a: [..., head_size] output over key set A.
        lse_a: [...] log-sum-exp over A (-inf if A is empty).
        out_b: [..., head_size] output over key set B, disjoint from A.
        lse_b: [...] log-sum-exp over B.

    Returns:
        (out, lse) over A ∪ B, float64. Two empty inputs give out 0 and lse -inf.

    Raises:
        TypeError / ValueError: not float arrays, or shapes that do not match.
    """
    out_a, lse_a, out_b, lse_b = check_out_lse(out_a, lse_a, out_b, lse_b)
    # TODO(lab3.4): (out, lse) is the state (m, l, acc) = (lse, 1, out) — with l = 0 where lse
    # is -inf. Merge with merge_partitions, then finalize_state.
    raise NotImplementedError("TODO(lab3.4): merge_attn_states — merge two (out, lse) results")


def paged_decode_split_k(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                         partition_size: int, alibi_slopes=None):
    """Split-K decode (flash-decoding, vLLM's ``paged_attention_v2``): partition, then merge.

    Each sequence's keys are cut into partitions of ``partition_size`` tokens; each partition's
    state comes from :func:`partition_attention` (on a GPU: one CTA each, in parallel), and a
    reduce step merges them. The grid is ``max_num_partitions`` wide for every sequence; the
    partitions past a sequence's end stay empty and merge as the identity.

    Args:
        query: [num_seqs, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        context_lens: [num_seqs] keys per sequence (0 allowed).
        scale: multiplies q·k.
        partition_size: tokens per partition, a positive multiple of block_size (so that a
            block never straddles two partitions, as in the kernels).
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): [num_seqs, num_q_heads, head_size] and [num_seqs, num_q_heads], float64,
        equal to :func:`paged_decode`'s up to float64 rounding.

    Raises:
        TypeError / ValueError / IndexError: bad arguments; ValueError names partition_size
            (a float or bool included: it must be an int that is a positive multiple).
    """
    # TODO(lab3.4): validate (partition_size an int that is a positive multiple of block_size,
    # else ValueError naming partition_size — a float or bool too). Allocate max_num_partitions empty states per sequence (at least
    # one), fill partition p of sequence s with partition_attention over
    # [p * partition_size, min((p + 1) * partition_size, context_len)), merge, finalize.
    raise NotImplementedError(
        "TODO(lab3.4): "
        "paged_decode_split_k — partition, attend, merge (flash-decoding)"
    )


# --------------------------------------------------------------------------------------------
# Task 5: numerics — half-precision storage, fp32 arithmetic (round_to is given, in
# _numerics.py).
# --------------------------------------------------------------------------------------------


def paged_decode_lowp(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                      alibi_slopes=None, *, dtype: str = "float16"):
    """Paged decode as a half-precision kernel computes it: fp16/bf16 data, fp32 arithmetic.

    Query and caches are rounded to ``dtype`` (what the kernel loads), every score, max,
    denominator and accumulator is float32 (what the kernel keeps in registers), and the output
    is rounded to ``dtype`` (what the kernel stores).

    Args:
        query: [num_seqs, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        context_lens: [num_seqs]
        scale: multiplies q·k.
        alibi_slopes: [num_q_heads] or None.
        dtype: storage precision, ``"float16"`` or ``"bfloat16"``.

    Returns:
        (out, lse): out [num_seqs, num_q_heads, head_size] float32 holding ``dtype`` values;
        lse [num_seqs, num_q_heads] float32.

    Raises:
        ValueError: unknown dtype, a ``scale`` or slope that is not finite (and > 0) in
            float32 — the kernels multiply in float32; otherwise as :func:`paged_decode`.
    """
    # TODO(lab3.5): round query and caches with round_to (what the kernel loads), run the same
    # paged decode in float32 (what it keeps in registers), round the output with round_to
    # (what it stores); lse as float32. Refuse an unknown dtype with ValueError, and check every
    # argument — scale and slopes finite *as float32* — before rounding the whole cache.
    raise NotImplementedError("TODO(lab3.5): paged_decode_lowp — fp16/bf16 data, fp32 arithmetic")
