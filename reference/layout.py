"""The one KV-cache layout every lab uses, and its constants.

``key_cache`` and ``value_cache`` are two arrays of shape
``[num_blocks, num_kv_heads, block_size, head_size]``: a physical block holds ``block_size``
consecutive tokens of one sequence, for every KV head, and within a (block, head) the tokens'
vectors are contiguous rows of ``head_size`` elements. A decode kernel that gives one CTA to a
(sequence, KV head) therefore streams ``block_size * head_size`` contiguous elements per block.

``block_tables`` is ``[num_seqs, max_blocks_per_seq]`` int32; row ``s`` lists sequence ``s``'s
physical blocks in logical order, padded with :data:`PAD_BLOCK_ID`. Token ``t`` of sequence ``s``
lives in block ``block_tables[s, t // block_size]`` at row ``t % block_size``; its *slot* is
``block_id * block_size + t % block_size``.

``context_lens`` is ``[num_seqs]`` int32: tokens whose K/V are in the cache.
"""

from __future__ import annotations

#: Padding in block tables. Negative, so it can never be a block id: a kernel that reads past a
#: sequence's last block gets an obviously invalid index instead of block 0's data.
PAD_BLOCK_ID = -1


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Returns how many blocks hold ``num_tokens`` tokens (``ceil(num_tokens / block_size)``)."""
    return -(-num_tokens // block_size)
