"""Lab 6: one step's inputs, and the block manager with its prefix cache, checked exactly."""

from __future__ import annotations

import pytest

from labs.lab06_serving_engine._cases import make_sequence
from labs.lab06_serving_engine._sequence import block_hash
from reference.errors import OutOfBlocksError
from reference.grader.proxy import given
from reference.layout import PAD_BLOCK_ID

BS = 4




@pytest.mark.points(4)
def test_prepare_inputs_packs_positions_slots_and_tables(impl):
    """A batch of a decode, a prompt chunk with history that crosses a block boundary, and a
    fresh prompt — listed out of seq_id order, blocks scattered — gives exactly the expected
    positions, slots (block_id * block_size + offset), PAD-padded tables as wide as the longest,
    lengths and offsets."""
    decode = make_sequence(impl, 5, range(100, 109), 8, [7, 2, 9])      # 9 tokens, 8 computed: 1 new
    chunk = make_sequence(impl, 1, range(200, 215), 6, [3, 0, 11, 4])   # 15 tokens, 6 computed: 7 new
    fresh = make_sequence(impl, 3, range(300, 303), 0, [6])              # 3 tokens, all new
    got = impl.prepare_inputs([(decode, 1), (chunk, 7), (fresh, 3)], BS)
    positions = [8] + list(range(6, 13)) + [0, 1, 2]
    tables = [[7, 2, 9], [3, 0, 11, 4], [6]]
    rows = [0] + [1] * 7 + [2] * 3
    slots = [tables[r][p // BS] * BS + p % BS for r, p in zip(rows, positions)]
    assert got.input_ids.tolist() == [108] + list(range(206, 213)) + [300, 301, 302], (
        "input_ids must be each request's tokens from num_computed_tokens on, in batch order")
    assert got.positions.tolist() == positions, (
        f"positions {got.positions.tolist()} != {positions}: a chunk's positions continue its "
        "history (start at num_computed_tokens), or RoPE rotates its keys wrongly")
    assert got.slot_mapping.tolist() == slots, (
        f"slot_mapping {got.slot_mapping.tolist()} != {slots}: slot = block_table[pos // bs] * bs "
        "+ pos % bs (look at positions 8 and 12, the first of a new block)")
    want_tables = [t + [PAD_BLOCK_ID] * (4 - len(t)) for t in tables]
    assert got.block_tables.tolist() == want_tables, (
        f"block_tables {got.block_tables.tolist()} != {want_tables}: row i belongs to the i-th "
        "scheduled request (not sorted by seq_id), padded with PAD_BLOCK_ID")
    assert got.context_lens.tolist() == [9, 13, 3], "context_lens = num_computed_tokens + new tokens"
    assert got.query_start_loc.tolist() == [0, 1, 8, 11], "query_start_loc: offsets of each request"
    assert got.logits_indices.tolist() == [0, 7, 10], "logits_indices: each request's last new token"
    one_block = impl.prepare_inputs([(fresh, 3)], BS)
    assert tuple(one_block.block_tables.shape) == (1, 1), (
        f"a batch whose longest table has 1 block gave block_tables of shape "
        f"{tuple(one_block.block_tables.shape)}, not (1, 1): [num_seqs, max_blocks], as wide as "
        "the longest table")


@pytest.mark.points(2)
def test_block_manager_takes_ceil_blocks_all_or_nothing(impl):
    """A request holds exactly ceil(tokens / block_size) blocks; it needs 0 more, never fewer,
    for fewer tokens than it holds; a refused allocation takes nothing; free gives every block
    back."""
    bm = impl.KVBlockManager(5, BS, enable_prefix_caching=False)
    seq = make_sequence(impl, 0, range(10), 0, [])
    for n, held in [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)]:
        bm.allocate(seq, n)
        assert len(seq.block_table) == held, (
            f"holding {n} tokens takes {len(seq.block_table)} blocks, expected ceil({n}/{BS}) = {held}")
    needed = [bm.num_blocks_needed(seq, n) for n in (1, 9, 13)]
    assert needed == [0, 0, 1], (
        f"a request holding 3 blocks of {BS} needs {needed} more blocks for 1, 9, 13 tokens, not "
        "[0, 0, 1]: ceil(tokens / block_size) minus the blocks held, at least 0")
    other = make_sequence(impl, 1, range(12), 0, [])
    with pytest.raises(OutOfBlocksError):
        bm.allocate(other, 12)  # 3 blocks, 2 free
    assert other.block_table == [] and bm.num_free_blocks == 2, (
        "a refused allocation must take nothing (check the free count before allocating)")
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 5, "free must give every block back"


@pytest.mark.points(3)
def test_prefix_cache_reuses_computed_full_blocks_only(impl):
    """Only computed full blocks enter the cache, under chained hashes; a match never covers a
    prompt's last token; a freed block leaves the cache."""
    bm = impl.KVBlockManager(16, BS)
    tokens = list(range(50, 60))  # 10 tokens: 2 full blocks + 2
    a = make_sequence(impl, 0, tokens, 0, [])
    bm.allocate(a, 10)
    a.num_computed_tokens = 6
    bm.cache_full_blocks(a)
    # NOTE: hashed where the implementation runs: hash(None) (a first block's parent) is the
    # object's address in Python 3.11, so it differs between processes.
    hash_block = given(impl, block_hash)
    h0 = hash_block(None, tokens[:4])
    assert bm.hash_to_block == {h0: a.block_table[0]}, (
        f"after 6 computed tokens the cache is {bm.hash_to_block}: only block 0 is full and computed")
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)
    h1 = hash_block(h0, tokens[4:8])
    assert bm.hash_to_block == {h0: a.block_table[0], h1: a.block_table[1]}, (
        "the second block's hash must chain the first's: block_hash(parent, tokens)")
    same = make_sequence(impl, 1, tokens[:8], 0, [])  # identical to a's first 8 tokens, block aligned
    ids, hashes = bm.match_prefix(same)
    assert ids == [a.block_table[0]] and hashes == [h0], (
        f"match_prefix of an 8-token prompt matched {ids}: its last token must be computed "
        "(for its logits), so at most (8 - 1) // 4 = 1 block may match")
    longer = make_sequence(impl, 2, tokens[:9] + [1, 2], 0, [])
    ids, _ = bm.match_prefix(longer)
    assert ids == a.block_table[:2], f"a longer prompt sharing 8 tokens matched {ids}"
    bm.use_prefix(longer, *bm.match_prefix(longer))
    assert longer.num_computed_tokens == 8 and bm.allocator.get_ref_count(a.block_table[0]) == 2, (
        "use_prefix shares the matched blocks: their tokens are computed, their ref counts go up")
    assert bm.prefix_hit_rate == pytest.approx(8 / 11), "hit rate = hit tokens / queried tokens"
    bm.free(longer)
    bm.free(a)
    assert bm.num_free_blocks == 16 and bm.hash_to_block == {}, (
        f"every block is free but the cache still lists {bm.hash_to_block}: a free block will be "
        "overwritten, so free must drop its cache entry")
    assert bm.match_prefix(same) == ([], []), "a freed block must not be matched"
