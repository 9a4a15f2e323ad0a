"""Test helpers for Lab 1: snapshots of a manager's whole state, and the invariant check."""

from __future__ import annotations


def snapshot(bm) -> tuple:
    """Everything observable about a BlockManager, as a comparable value."""
    return (
        tuple(bm.free_block_queue.block_ids()),
        tuple(b.ref_count for b in bm.blocks),
        tuple(b.block_hash for b in bm.blocks),
        tuple(sorted((h, b.block_id) for h, b in bm.cached_block_hash_to_block.items())),
    )


def check_invariants(bm) -> None:
    """Asserts the manager's invariants, with a message that says which one broke."""
    queued = bm.free_block_queue.block_ids()
    assert len(queued) == len(set(queued)), f"a block is queued twice: {queued}"
    assert len(queued) == bm.num_free_blocks, (
        f"num_free_blocks={bm.num_free_blocks} but the free queue holds {len(queued)} blocks"
    )
    for block in bm.blocks:
        assert block.ref_count >= 0, f"block {block.block_id} has ref_count {block.ref_count}"
        in_queue = block.block_id in set(queued)
        assert in_queue == (block.ref_count == 0), (
            f"block {block.block_id}: ref_count={block.ref_count} but "
            f"{'in' if in_queue else 'not in'} the free queue — a block must be free xor used"
        )
    used = sum(1 for b in bm.blocks if b.ref_count > 0)
    assert used + bm.num_free_blocks == bm.num_blocks, "free + used != total"
    for h, block in bm.cached_block_hash_to_block.items():
        assert block.block_hash == h, f"map entry {h} points at block with hash {block.block_hash}"
    for block in bm.blocks:
        if block.block_hash is not None:
            assert bm.cached_block_hash_to_block.get(block.block_hash) is block, (
                f"block {block.block_id} has hash {block.block_hash} but is not its map entry"
            )
