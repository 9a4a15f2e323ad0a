"""Trusted float64 attention oracles for the paged-attention labs.

These are deliberately the *slow, obvious* computation — gather every page into a contiguous
array, form the full score matrix, softmax with its max subtracted — with none of the tricks the
labs teach (no online softmax, no blocking, no split-K). Labs 4 and 5 check their kernels
against these functions, so a student's unfinished Lab 3 never affects their grade.

Semantics shared by every lab (Lab 3 teaches them, Labs 4–5 implement them):
  * GQA: query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)``.
  * Causal with history: in a sequence with ``kv_len`` tokens of which the last ``q_len`` are
    queries, query ``i`` (0-based among the queries) sees keys ``0 .. kv_len - q_len + i``.
    A decode query is the last token: it sees every key.
  * ALiBi: ``score += slope[h] * (key_pos - query_pos)`` (never positive under causal masking).
  * A sequence with no keys (``context_len == 0``) has output exactly 0 and log-sum-exp -inf —
    the identity of the split-K merge. Kernels must write those zeros.
  * NaN/inf: arguments are checked (shapes, dtypes, ids, lengths, a finite scale and slopes);
    data is not scanned. Non-finite data a query reads makes that query's output non-finite
    (a -inf score computed from data becomes NaN, never "masked"); rows it does not read never
    matter.
"""

from __future__ import annotations

import numpy as np

from reference.checks import (
    check_alibi_slopes,
    check_block_tables,
    check_cu_seqlens,
    check_dense_inputs,
    check_float_array,
    check_head_size,
    check_heads,
    check_int,
    check_kv_cache,
    check_scale,
)
from reference.layout import num_blocks_for


def gather_kv(key_cache, value_cache, block_table, context_len: int):
    """Copies one sequence's pages into contiguous float64 K and V.

    Args:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_table: [max_blocks_per_seq] the sequence's row of the block table
        context_len: tokens to gather.

    Returns:
        (k, v), each [context_len, num_kv_heads, head_size] float64.

    Raises:
        TypeError / ValueError / IndexError: bad caches, length or block table (an entry the
            sequence needs that is not a block id, PAD included).
    """
    num_blocks, _, block_size, _ = check_kv_cache(key_cache, value_cache)
    context_len = check_int("context_len", context_len, min_value=0)
    table = np.asarray(block_table) if isinstance(block_table, (list, tuple)) else block_table
    if not isinstance(table, np.ndarray):
        raise TypeError(f"block_table must be an int array, got {type(block_table).__name__}")
    tables, _ = check_block_tables(table[None], [context_len], num_blocks, block_size)
    n_blocks = num_blocks_for(context_len, block_size)
    ids = tables[0, :n_blocks]
    k = np.asarray(key_cache, dtype=np.float64)[ids]  # [n_blocks, Hkv, bs, D]
    v = np.asarray(value_cache, dtype=np.float64)[ids]
    k = k.transpose(0, 2, 1, 3).reshape(n_blocks * block_size, *k.shape[1:2], k.shape[3])
    v = v.transpose(0, 2, 1, 3).reshape(n_blocks * block_size, *v.shape[1:2], v.shape[3])
    return k[:context_len], v[:context_len]


def attention_ref(q, k, v, scale: float, *, causal: bool = True, alibi_slopes=None):
    """Dense attention for one sequence, in float64.

    Args:
        q: [q_len, num_q_heads, head_size] — the *last* q_len positions of the sequence.
        k: [kv_len, num_kv_heads, head_size]
        v: [kv_len, num_kv_heads, head_size]
        scale: multiplies q·k.
        causal: mask keys after each query's position.
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): out [q_len, num_q_heads, head_size], lse [q_len, num_q_heads] (natural log
        of the softmax denominator, including the max; -inf for a query that sees no key).

    Raises:
        TypeError / ValueError: bad arrays, head counts, scale or slopes, or
            ``0 < kv_len < q_len`` with ``causal``.
    """
    q, k, v = check_dense_inputs(q, k, v, causal)
    q_len, num_q_heads, head_size = q.shape
    kv_len, num_kv_heads, _ = k.shape
    check_heads(num_q_heads, num_kv_heads)
    if causal and 0 < kv_len < q_len:  # (no keys at all is the zero-length case: out 0)
        raise ValueError(f"q_len={q_len} > kv_len={kv_len}: causal queries are the last q_len keys")
    scale = check_scale(scale)
    alibi_slopes = check_alibi_slopes(alibi_slopes, num_q_heads)
    out = np.zeros((q_len, num_q_heads, head_size))
    lse = np.full((q_len, num_q_heads), -np.inf)
    if q_len == 0 or kv_len == 0:
        return out, lse
    group = num_q_heads // num_kv_heads
    kh = np.repeat(k, group, axis=1)  # [kv_len, Hq, D]: query head h reads KV head h // group
    vh = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, kh) * scale  # [Hq, q_len, kv_len]
    scores = np.where(np.isneginf(scores), np.nan, scores)  # data -inf is not a mask
    q_pos = np.arange(kv_len - q_len, kv_len)
    k_pos = np.arange(kv_len)
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        scores = scores + slopes[:, None, None] * (k_pos[None, None, :] - q_pos[None, :, None])
    if causal:
        scores = np.where(k_pos[None, None, :] <= q_pos[None, :, None], scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - m)
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", p / denom, vh)
    lse = (np.log(denom) + m)[..., 0].T
    return out, lse


def paged_decode_ref(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                     alibi_slopes=None):
    """Decode attention over a paged cache, in float64.

    Args:
        query: [num_seqs, num_q_heads, head_size]
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq]
        context_lens: [num_seqs]
        scale: softmax scale.
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): [num_seqs, num_q_heads, head_size] and [num_seqs, num_q_heads], float64.

    Raises:
        TypeError / ValueError / IndexError: bad arrays, head counts, block tables, lengths,
            scale or slopes (all checked before anything is computed).
    """
    num_blocks, num_kv_heads, block_size, cache_head_size = check_kv_cache(key_cache,
                                                                           value_cache)
    check_float_array("query", query, 3, "[num_seqs, num_q_heads, head_size]")
    num_seqs, num_q_heads, head_size = query.shape
    check_head_size("query", head_size, cache_head_size)
    check_heads(num_q_heads, num_kv_heads)
    block_tables, context_lens = check_block_tables(block_tables, context_lens, num_blocks,
                                                    block_size)
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"query has {num_seqs} sequences but block_tables has "
                         f"{block_tables.shape[0]} rows")
    check_scale(scale)
    check_alibi_slopes(alibi_slopes, num_q_heads)
    out = np.zeros((num_seqs, num_q_heads, head_size))
    lse = np.full((num_seqs, num_q_heads), -np.inf)
    for s in range(num_seqs):
        n = int(context_lens[s])
        k, v = gather_kv(key_cache, value_cache, block_tables[s], n)
        o, l = attention_ref(query[s : s + 1], k, v, scale, causal=True, alibi_slopes=alibi_slopes)
        out[s], lse[s] = o[0], l[0]
    return out, lse


def paged_prefill_ref(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens,
                      scale: float, *, causal: bool = True, alibi_slopes=None):
    """Varlen prefill attention over a paged cache (queries are each sequence's last tokens).

    Args:
        query: [total_query_tokens, num_q_heads, head_size], sequences packed back to back.
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq]
        cu_seqlens_q: [num_seqs + 1] query offsets.
        context_lens: [num_seqs] keys per sequence (history + new tokens).
        scale: softmax scale.
        causal: causal masking with history (see the module docstring).
        alibi_slopes: [num_q_heads] or None.

    Returns:
        (out, lse): [total_query_tokens, num_q_heads, head_size] and
        [total_query_tokens, num_q_heads], float64.

    Raises:
        TypeError / ValueError / IndexError: bad arrays, offsets, head counts, block tables,
            lengths, scale or slopes (all checked before anything is computed).
    """
    num_blocks, num_kv_heads, block_size, cache_head_size = check_kv_cache(key_cache,
                                                                           value_cache)
    check_float_array("query", query, 3, "[total_query_tokens, num_q_heads, head_size]")
    total, num_q_heads, head_size = query.shape
    check_head_size("query", head_size, cache_head_size)
    check_heads(num_q_heads, num_kv_heads)
    block_tables, context_lens = check_block_tables(block_tables, context_lens, num_blocks,
                                                    block_size)
    cu_seqlens_q = check_cu_seqlens(cu_seqlens_q, block_tables.shape[0], total, context_lens)
    check_scale(scale)
    check_alibi_slopes(alibi_slopes, num_q_heads)
    out = np.zeros((total, num_q_heads, head_size))
    lse = np.full((total, num_q_heads), -np.inf)
    for s in range(len(cu_seqlens_q) - 1):
        a, b = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k, v = gather_kv(key_cache, value_cache, block_tables[s], int(context_lens[s]))
        out[a:b], lse[a:b] = attention_ref(query[a:b], k, v, scale, causal=causal,
                                           alibi_slopes=alibi_slopes)
    return out, lse
