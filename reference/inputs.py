"""Seeded input generators for the attention labs: paged K/V caches with poisoned padding.

Every generator takes a ``seed`` and returns NumPy arrays, so a failing case is reproducible
from its seed alone. Caches are *poisoned*: every element that holds no valid token — unused
blocks, and the rows past the end of each sequence's partial last block — is NaN. Reading one
turns the output into NaN, so "read one row too many" can never pass quietly.

Physical blocks are a random permutation, so logical order never matches physical order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.checks import check_int, check_int_list, check_scale
from reference.layout import PAD_BLOCK_ID, num_blocks_for


@dataclass
class PagedKV:
    """A paged KV cache and the logical content it stores.

    Attributes:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [num_seqs, max_blocks_per_seq] int32, padded with PAD_BLOCK_ID
        context_lens: [num_seqs] int32
        keys: per sequence, [context_len, num_kv_heads, head_size] — what the pages hold
        values: per sequence, [context_len, num_kv_heads, head_size]
    """

    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray
    keys: list
    values: list

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[2]


def make_paged_kv(
    seed: int,
    context_lens,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    *,
    dtype=np.float16,
    extra_blocks: int = 3,
    max_blocks_per_seq: int | None = None,
    poison: bool = True,
    scale: float = 1.0,
) -> PagedKV:
    """Builds a random paged cache holding random K/V for each sequence.

    Args:
        seed: RNG seed.
        context_lens: tokens per sequence (0 allowed).
        num_kv_heads: KV heads.
        head_size: elements per head vector.
        block_size: tokens per block.
        dtype: cache dtype (float16, float32, float64; bf16 is made by the GPU labs from fp32).
        extra_blocks: unused (poisoned) physical blocks mixed into the pool.
        max_blocks_per_seq: block-table width; default: the longest sequence's blocks + 2.
        poison: fill every element that holds no token with NaN.
        scale: standard deviation of the K/V entries.

    Returns:
        The cache, its block tables, and the logical K/V per sequence (in ``dtype``).

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (named).
    """
    seed = check_int("seed", seed, min_value=0)
    lens = np.asarray(check_int_list("context_lens", context_lens, min_value=0), dtype=np.int64)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    head_size = check_int("head_size", head_size, min_value=1)
    block_size = check_int("block_size", block_size, min_value=1)
    extra_blocks = check_int("extra_blocks", extra_blocks, min_value=0)
    if max_blocks_per_seq is not None:
        max_blocks_per_seq = check_int("max_blocks_per_seq", max_blocks_per_seq, min_value=0)
    try:
        if np.dtype(dtype).kind != "f":
            raise TypeError
    except TypeError:
        raise TypeError(f"dtype must be a numpy float dtype, got {dtype!r}") from None
    scale = check_scale(scale)
    rng = np.random.default_rng(seed)
    per_seq = [num_blocks_for(int(n), block_size) for n in lens]
    num_blocks = sum(per_seq) + extra_blocks
    width = max_blocks_per_seq if max_blocks_per_seq is not None else max(per_seq, default=0) + 2
    if width < max(per_seq, default=0):
        raise ValueError(f"max_blocks_per_seq={width} is smaller than a sequence needs")
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    fill = np.nan if poison else 0.0
    key_cache = np.full(shape, fill, dtype=dtype)
    value_cache = np.full(shape, fill, dtype=dtype)
    block_tables = np.full((len(lens), max(width, 1)), PAD_BLOCK_ID, dtype=np.int32)
    physical = rng.permutation(num_blocks)
    keys, values = [], []
    next_block = 0
    for s, n in enumerate(lens):
        k = (rng.standard_normal((n, num_kv_heads, head_size)) * scale).astype(dtype)
        v = (rng.standard_normal((n, num_kv_heads, head_size)) * scale).astype(dtype)
        keys.append(k)
        values.append(v)
        for j in range(per_seq[s]):
            block = int(physical[next_block])
            next_block += 1
            block_tables[s, j] = block
            rows = slice(j * block_size, min((j + 1) * block_size, int(n)))
            count = rows.stop - rows.start
            key_cache[block, :, :count, :] = k[rows].transpose(1, 0, 2)
            value_cache[block, :, :count, :] = v[rows].transpose(1, 0, 2)
    return PagedKV(key_cache, value_cache, block_tables, lens.astype(np.int32), keys, values)


@dataclass
class DecodeCase:
    """One decode step: a query per sequence against a paged cache.

    Attributes:
        query: [num_seqs, num_q_heads, head_size]
        kv: the paged cache (context_lens include the current token)
        scale: softmax scale, 1/sqrt(head_size)
        alibi_slopes: [num_q_heads] float32, or None
    """

    query: np.ndarray
    kv: PagedKV
    scale: float
    alibi_slopes: np.ndarray | None = None


def make_decode_case(
    seed: int,
    context_lens,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    *,
    dtype=np.float16,
    alibi: bool = False,
    **kv_kwargs,
) -> DecodeCase:
    """Builds a random decode case (see :func:`make_paged_kv` for the cache arguments).

    Raises:
        TypeError / ValueError: bad arguments (named); ``num_q_heads`` not a multiple of
            ``num_kv_heads``.
    """
    num_q_heads = check_int("num_q_heads", num_q_heads, min_value=1)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    kv = make_paged_kv(seed, context_lens, num_kv_heads, head_size, block_size, dtype=dtype, **kv_kwargs)
    rng = np.random.default_rng(seed + 10_007)
    query = rng.standard_normal((len(kv.context_lens), num_q_heads, head_size)).astype(dtype)
    slopes = alibi_slopes(num_q_heads) if alibi else None
    return DecodeCase(query, kv, 1.0 / float(np.sqrt(head_size)), slopes)


@dataclass
class PrefillCase:
    """One varlen prefill step: new query tokens, packed, over history already in the cache.

    Attributes:
        query: [total_query_tokens, num_q_heads, head_size], sequences back to back
        cu_seqlens_q: [num_seqs + 1] int32, query token offsets (cu_seqlens_q[0] == 0)
        kv: the paged cache holding history *and* the new tokens' K/V;
            kv.context_lens[s] == history_lens[s] + query_lens[s]
        history_lens: [num_seqs] int32, tokens before the new ones
        scale: softmax scale
        alibi_slopes: [num_q_heads] float32, or None
    """

    query: np.ndarray
    cu_seqlens_q: np.ndarray
    kv: PagedKV
    history_lens: np.ndarray
    scale: float
    alibi_slopes: np.ndarray | None = None


def make_prefill_case(
    seed: int,
    query_lens,
    history_lens,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    *,
    dtype=np.float16,
    alibi: bool = False,
    **kv_kwargs,
) -> PrefillCase:
    """Builds a random varlen prefill case with history (chunked prefill).

    Raises:
        TypeError / ValueError: bad arguments (named), or lists of different lengths.
    """
    q_lens = np.asarray(check_int_list("query_lens", query_lens, min_value=0), dtype=np.int64)
    h_lens = np.asarray(check_int_list("history_lens", history_lens, min_value=0), dtype=np.int64)
    num_q_heads = check_int("num_q_heads", num_q_heads, min_value=1)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    if q_lens.shape != h_lens.shape:
        raise ValueError("query_lens and history_lens must have the same length")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    kv = make_paged_kv(seed, q_lens + h_lens, num_kv_heads, head_size, block_size, dtype=dtype, **kv_kwargs)
    rng = np.random.default_rng(seed + 20_011)
    query = rng.standard_normal((int(q_lens.sum()), num_q_heads, head_size)).astype(dtype)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    slopes = alibi_slopes(num_q_heads) if alibi else None
    return PrefillCase(query, cu, kv, h_lens.astype(np.int32), 1.0 / float(np.sqrt(head_size)), slopes)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Returns the ALiBi slopes of Press et al. for ``num_heads`` heads, as float32.

    For a power of two ``n`` the slopes are ``2^(-8/n), 2^(-16/n), ...``; other counts take
    the power of two below and interleave the next one's odd slopes, as in the paper's code.

    Raises:
        TypeError / ValueError: ``num_heads`` is not an int >= 1.
    """
    num_heads = check_int("num_heads", num_heads, min_value=1)
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        slopes = power_of_two(num_heads)
    else:
        lower = 1 << (num_heads.bit_length() - 1)
        slopes = power_of_two(lower) + power_of_two(2 * lower)[0::2][: num_heads - lower]
    return np.asarray(slopes, dtype=np.float32)
