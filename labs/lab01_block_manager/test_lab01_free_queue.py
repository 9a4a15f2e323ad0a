"""Lab 1: the O(1) doubly linked free queue (vLLM's FreeKVCacheBlockQueue idea)."""

from __future__ import annotations

import pytest


def _blocks(impl, n):
    return [impl.KVCacheBlock(block_id=i) for i in range(n)]


@pytest.mark.points(1)
def test_queue_starts_in_given_order(impl):
    """A new queue holds its blocks head-first in the given order; popleft takes the head."""
    blocks = _blocks(impl, 5)
    q = impl.FreeBlockQueue(blocks)
    assert len(q) == 5 and q.num_free_blocks == 5
    assert q.block_ids() == [0, 1, 2, 3, 4]
    assert q.popleft() is blocks[0]
    assert q.block_ids() == [1, 2, 3, 4] and len(q) == 4


@pytest.mark.points(2)
def test_remove_from_head_middle_and_tail_relinks_neighbours(impl):
    """remove() unlinks a block from anywhere and clears its links; append() adds at the tail."""
    blocks = _blocks(impl, 6)
    q = impl.FreeBlockQueue(blocks)
    q.remove(blocks[3])
    assert q.block_ids() == [0, 1, 2, 4, 5]
    assert blocks[3].prev_free is None and blocks[3].next_free is None, (
        "a removed block must forget its neighbours, or it still looks queued"
    )
    q.remove(blocks[0])
    q.remove(blocks[5])
    assert q.block_ids() == [1, 2, 4] and len(q) == 3
    q.append(blocks[3])
    q.append(blocks[0])
    assert q.block_ids() == [1, 2, 4, 3, 0]
    assert [q.popleft().block_id for _ in range(5)] == [1, 2, 4, 3, 0]
    assert len(q) == 0 and q.block_ids() == []


@pytest.mark.points(1)
def test_queue_misuse_raises(impl):
    """popleft on an empty queue is an IndexError; removing an unqueued block or appending a
    queued one is a ValueError (either would corrupt the links)."""
    blocks = _blocks(impl, 2)
    q = impl.FreeBlockQueue(blocks[:1])
    with pytest.raises(ValueError):
        q.remove(blocks[1])
    with pytest.raises(ValueError):
        q.append(blocks[0])
    assert q.block_ids() == [0]
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft()


@pytest.mark.points(1)
def test_block_repr_does_not_walk_the_free_queue(impl):
    """repr() of a queued block stays short: it shows the block, not its queue neighbours, so
    printing one block (a failing assert, a debugger) never walks the whole free queue."""
    blocks = _blocks(impl, 2000)
    impl.FreeBlockQueue(blocks)
    for block in (blocks[0], blocks[1000], blocks[-1]):
        try:
            text = repr(block)
        except RecursionError:
            text = "<RecursionError>"
        assert len(text) < 200 and f"block_id={block.block_id}" in text, (
            f"repr(block {block.block_id}) in a 2000-block queue is {len(text)} characters "
            f"({text[:80]}...): prev_free/next_free must stay out of the repr "
            "(field(repr=False)), or printing one block prints, and recurses through, the queue")
