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
"""

from __future__ import annotations

import numpy as np

from labs.lab03_paged_attention_oracle._checks import (
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
from reference.layout import num_blocks_for


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
    q, k, v = check_dense_inputs(q, k, v, causal)
    q_len, num_q_heads, head_size = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = check_heads(num_q_heads, num_kv_heads)
    if causal and q_len > kv_len:
        raise ValueError(f"q_len={q_len} > kv_len={kv_len}: causal queries are the last q_len keys")
    scale = check_scale(scale)
    slopes = check_alibi_slopes(alibi_slopes, num_q_heads)
    out = np.zeros((q_len, num_q_heads, head_size))
    lse = np.full((q_len, num_q_heads), -np.inf)
    if q_len == 0 or kv_len == 0:
        return out, lse
    # GQA: query head h uses KV head h // group, so each KV head is repeated group times in a row.
    k_per_q_head = np.repeat(k, group, axis=1)  # [kv_len, num_q_heads, head_size]
    v_per_q_head = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k_per_q_head) * scale  # [num_q_heads, q_len, kv_len]
    scores = _data_neg_inf_to_nan(scores)
    query_pos = np.arange(kv_len - q_len, kv_len)  # [q_len]
    key_pos = np.arange(kv_len)  # [kv_len]
    if slopes is not None:
        scores = scores + slopes[:, None, None] * (key_pos[None, None, :] - query_pos[None, :, None])
    if causal:
        visible = key_pos[None, :] <= query_pos[:, None]  # [q_len, kv_len]
        scores = np.where(visible[None], scores, -np.inf)
    m = scores.max(axis=-1)  # [num_q_heads, q_len]
    seen = np.isfinite(m)
    p = np.exp(scores - np.where(seen, m, 0.0)[..., None])  # masked keys: exp(-inf) = 0
    denom = p.sum(axis=-1)  # [num_q_heads, q_len]
    safe = np.where(seen, denom, 1.0)
    out = np.einsum("hqk,khd->qhd", p / safe[..., None], v_per_q_head)
    lse = np.where(seen, m + np.log(safe), -np.inf).T
    return out, lse


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
    group = check_heads(num_q_heads, num_kv_heads)
    return np.arange(num_q_heads) // group


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
    return (np.full(lead_shape, -np.inf, dtype=dtype), np.zeros(lead_shape, dtype=dtype),
            np.zeros(lead_shape + (head_size,), dtype=dtype))


def _finite_max(m):
    """Returns ``m`` with -inf replaced by 0: the shift to subtract before ``exp``.

    NOTE: while no key has been seen, the running max is -inf, and exp(m - m_new) with both
    -inf is exp(nan) = NaN. Every score and every old max is then -inf too, so subtracting any
    finite number gives exp(-inf) = 0 — exactly the weight a state with no keys deserves.
    """
    return np.where(np.isneginf(m), 0.0, m)


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
    if scores.shape[-1] == 0:
        return m, l, acc
    m_new = np.maximum(m, scores.max(axis=-1))  # [...]
    shift = _finite_max(m_new)  # [...]
    correction = np.exp(m - shift)  # [...] rescales the history to the new max; 0 when m = -inf
    p = np.exp(scores - shift[..., None])  # [..., n] the block's weights on the new scale
    l_new = l * correction + p.sum(axis=-1)
    acc_new = acc * correction[..., None] + (p[..., None, :] @ values)[..., 0, :]
    return m_new, l_new, acc_new


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
    empty = l == 0
    safe_l = np.where(empty, 1.0, l)
    out = np.where(empty[..., None], 0.0, acc / safe_l[..., None])
    lse = np.where(empty, -np.inf, m + np.log(safe_l))
    return out, lse


def _alibi_bias(slopes, query_pos, key_pos):
    """Returns ``slope[h] * (key_pos - query_pos)``: [num_q_heads, *query_pos.shape, n].

    Keys before the query get a negative bias that grows with distance; the query's own key 0.
    """
    query_pos = np.asarray(query_pos)
    distance = key_pos - query_pos[..., None]  # [*query_pos.shape, n]
    return slopes.reshape((-1,) + (1,) * distance.ndim) * distance


def _blocks_in_range(block_table, block_size: int, start_token_idx: int, end_token_idx: int):
    """Yields ``(block_id, row_start, row_end, block_start)`` for each logical block that holds
    tokens of ``[start_token_idx, end_token_idx)``, in logical order.

    Rows ``row_start .. row_end - 1`` of physical block ``block_id`` hold tokens
    ``block_start + row_start .. block_start + row_end - 1``.
    """
    first = start_token_idx // block_size
    for logical_block_idx in range(first, num_blocks_for(end_token_idx, block_size)):
        block_start = logical_block_idx * block_size
        row_start = max(start_token_idx - block_start, 0)
        # NOTE: the last block of a sequence is usually partial; its other rows hold no token
        # (garbage in a real cache, NaN in ours) and must not even be read.
        row_end = min(end_token_idx - block_start, block_size)
        yield int(block_table[logical_block_idx]), row_start, row_end, block_start


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
    num_blocks, num_kv_heads, block_size, head_size = check_kv_cache(key_cache, value_cache)
    check_float_array("query", query, 2, "[num_q_heads, head_size]")
    num_q_heads = query.shape[0]
    check_head_size("query", query.shape[1], head_size)
    kv_heads = kv_head_indices(num_q_heads, num_kv_heads)  # [num_q_heads]
    compute_dtype = check_float_dtype(compute_dtype, "compute_dtype").type
    context_len = check_int("context_len", context_len, min_value=0)
    start_token_idx = check_int("start_token_idx", start_token_idx)
    end_token_idx = context_len if end_token_idx is None else check_int("end_token_idx",
                                                                         end_token_idx)
    if not 0 <= start_token_idx <= end_token_idx <= context_len:
        raise ValueError(f"need 0 <= start_token_idx <= end_token_idx <= context_len, got "
                         f"{start_token_idx}, {end_token_idx}, {context_len}")
    tables, lens = check_block_tables(check_values_array("block_table", block_table)[None],
                                      [context_len], num_blocks, block_size)
    slopes = check_alibi_slopes(alibi_slopes, num_q_heads, compute_dtype)
    scale = check_scale(scale, compute_dtype)

    q = query.astype(compute_dtype)
    m, l, acc = empty_state((num_q_heads,), head_size, compute_dtype)
    query_pos = context_len - 1
    for block_id, row_start, row_end, block_start in _blocks_in_range(
            tables[0], block_size, start_token_idx, end_token_idx):
        # One physical block, every query head at once: gather each head's KV head.
        k = key_cache[block_id, :, row_start:row_end].astype(compute_dtype)[kv_heads]  # [Hq, n, D]
        v = value_cache[block_id, :, row_start:row_end].astype(compute_dtype)[kv_heads]
        scores = _data_neg_inf_to_nan(np.einsum("hd,hnd->hn", q, k) * compute_dtype(scale))
        if slopes is not None:
            key_pos = block_start + np.arange(row_start, row_end)  # [n]
            scores = scores + _alibi_bias(slopes, query_pos, key_pos).astype(compute_dtype)
        m, l, acc = online_softmax_update(m, l, acc, scores, v)
    return m, l, acc


def _check_decode_args(query, key_cache, value_cache, block_tables, context_lens, scale,
                       alibi_slopes, compute_dtype=np.float64):
    """Validates a paged decode call; returns (num_seqs, num_q_heads, block_size, head_size,
    tables, lens) with tables/lens as checked int arrays."""
    num_blocks, num_kv_heads, block_size, head_size = check_kv_cache(key_cache, value_cache)
    check_float_array("query", query, 3, "[num_seqs, num_q_heads, head_size]")
    num_seqs, num_q_heads, _ = query.shape
    check_head_size("query", query.shape[2], head_size)
    check_heads(num_q_heads, num_kv_heads)
    tables, lens = check_block_tables(block_tables, context_lens, num_blocks, block_size)
    if tables.shape[0] != num_seqs:
        raise ValueError(f"query has {num_seqs} sequences but block_tables has {tables.shape[0]} rows")
    check_alibi_slopes(alibi_slopes, num_q_heads, compute_dtype)
    check_scale(scale, compute_dtype)
    return num_seqs, num_q_heads, block_size, head_size, tables, lens


def _paged_decode(query, key_cache, value_cache, block_tables, context_lens, scale,
                  alibi_slopes, compute_dtype):
    """paged_decode in a given compute dtype (float64 for Task 2, float32 for Task 5)."""
    num_seqs, num_q_heads, block_size, head_size, tables, lens = _check_decode_args(
        query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes,
        compute_dtype)
    out = np.zeros((num_seqs, num_q_heads, head_size), dtype=compute_dtype)
    lse = np.full((num_seqs, num_q_heads), -np.inf, dtype=compute_dtype)
    for seq_idx in range(num_seqs):
        state = partition_attention(query[seq_idx], key_cache, value_cache, tables[seq_idx],
                                    int(lens[seq_idx]), scale, alibi_slopes=alibi_slopes,
                                    compute_dtype=compute_dtype)
        out[seq_idx], lse[seq_idx] = finalize_state(*state)
    return out, lse


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
    return _paged_decode(query, key_cache, value_cache, block_tables, context_lens, scale,
                         alibi_slopes, np.float64)


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
    num_blocks, num_kv_heads, block_size, head_size = check_kv_cache(key_cache, value_cache)
    check_float_array("query", query, 3, "[total_query_tokens, num_q_heads, head_size]")
    total_tokens, num_q_heads, _ = query.shape
    check_head_size("query", query.shape[2], head_size)
    kv_heads = kv_head_indices(num_q_heads, num_kv_heads)  # [num_q_heads]
    tables, lens = check_block_tables(block_tables, context_lens, num_blocks, block_size)
    cu = check_cu_seqlens(cu_seqlens_q, tables.shape[0], total_tokens, lens)
    slopes = check_alibi_slopes(alibi_slopes, num_q_heads)
    scale = check_scale(scale)

    out = np.zeros((total_tokens, num_q_heads, head_size))
    lse = np.full((total_tokens, num_q_heads), -np.inf)
    for seq_idx in range(tables.shape[0]):
        q_start, q_end = int(cu[seq_idx]), int(cu[seq_idx + 1])
        q_len, context_len = q_end - q_start, int(lens[seq_idx])
        if q_len == 0:
            continue
        history_len = context_len - q_len
        q = query[q_start:q_end].astype(np.float64).transpose(1, 0, 2)  # [Hq, q_len, D]
        causal_limit = history_len + np.arange(q_len)  # [q_len] last key each query sees
        m, l, acc = empty_state((num_q_heads, q_len), head_size)
        for block_id, row_start, row_end, block_start in _blocks_in_range(
                tables[seq_idx], block_size, 0, context_len):
            k = key_cache[block_id, :, row_start:row_end].astype(np.float64)[kv_heads]  # [Hq, n, D]
            v = value_cache[block_id, :, row_start:row_end].astype(np.float64)[kv_heads]
            key_pos = block_start + np.arange(row_start, row_end)  # [n]
            scores = _data_neg_inf_to_nan((q @ k.transpose(0, 2, 1)) * scale)  # [Hq, q_len, n]
            if slopes is not None:
                scores = scores + _alibi_bias(slopes, causal_limit, key_pos)
            visible = key_pos[None, :] <= causal_limit[:, None]  # [q_len, n]
            scores = np.where(visible[None], scores, -np.inf)
            m, l, acc = online_softmax_update(m, l, acc, scores, v[:, None])  # v: [Hq, 1, n, D]
        o, s = finalize_state(m, l, acc)  # [Hq, q_len, D], [Hq, q_len]
        out[q_start:q_end], lse[q_start:q_end] = o.transpose(1, 0, 2), s.T
    return out, lse


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
    m_max = m.max(axis=0)  # [...]
    weight = np.exp(m - _finite_max(m_max))  # [num_partitions, ...]
    return m_max, (l * weight).sum(axis=0), (acc * weight[..., None]).sum(axis=0)


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
    lse = np.stack([lse_a, lse_b])
    out = np.stack([out_a, out_b])
    return finalize_state(*merge_partitions(lse, np.where(np.isneginf(lse), 0.0, 1.0), out))


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
    num_seqs, num_q_heads, block_size, head_size, tables, lens = _check_decode_args(
        query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes)
    original_partition_size = partition_size
    try:
        partition_size = check_int("partition_size", partition_size)
    except TypeError:
        partition_size = None  # refused below, as a ValueError like any bad partition_size
    if partition_size is None or partition_size <= 0 or partition_size % block_size:
        raise ValueError(f"partition_size must be an int, a positive multiple of "
                         f"block_size={block_size}, got {original_partition_size!r}")
    max_num_partitions = max(1, num_blocks_for(int(lens.max(initial=0)), int(partition_size)))
    m, l, acc = empty_state((max_num_partitions, num_seqs, num_q_heads), head_size)
    for seq_idx in range(num_seqs):
        context_len = int(lens[seq_idx])
        for part_idx in range(num_blocks_for(context_len, int(partition_size))):
            start = part_idx * int(partition_size)
            end = min(start + int(partition_size), context_len)
            m[part_idx, seq_idx], l[part_idx, seq_idx], acc[part_idx, seq_idx] = partition_attention(
                query[seq_idx], key_cache, value_cache, tables[seq_idx], context_len, scale,
                start, end, alibi_slopes)
    return finalize_state(*merge_partitions(m, l, acc))


# --------------------------------------------------------------------------------------------
# Task 5: numerics — half-precision storage, fp32 arithmetic.
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
    if dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(f"dtype must be one of {LOW_PRECISION_DTYPES}, got {dtype!r}")
    # Every argument is checked before the (costly) rounding of the whole cache.
    _check_decode_args(query, key_cache, value_cache, block_tables, context_lens, scale,
                       alibi_slopes, np.float32)
    q, k, v = round_to(query, dtype), round_to(key_cache, dtype), round_to(value_cache, dtype)
    slopes = check_alibi_slopes(alibi_slopes, query.shape[1], np.float32)
    out, lse = _paged_decode(q, k, v, block_tables, context_lens, scale, slopes,
                             compute_dtype=np.float32)
    return round_to(out, dtype), lse.astype(np.float32)

