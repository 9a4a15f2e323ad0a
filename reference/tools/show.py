"""``pagedlab show 1|2``: draw *your* Lab 1 block manager or Lab 2 pool after each step.

Runs a short fixed scenario on the implementation under test (``LAB_IMPL``; a student release
defaults to ``starter``) and prints the state after every step as text: per block its ref count
and cached hash, the free queue head to tail (Lab 1); per sequence its table row, context length
and the ref counts of its blocks (Lab 2). A step that raises is shown with its error and ends
the scenario — the last picture is where your state went wrong. Compare with the notebook's
pictures of the reference behaviour.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from reference.loader import LabImplError, describe_impl, load_impl
from reference.paths import resolve_labs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", help="1 (block manager) or 2 (KV-cache pool)")


def _short(h) -> str:
    return "-" if h is None else f"{h & 0xFFFF:04x}…"


def draw_block_manager(bm) -> str:
    """Returns a text picture of a Lab 1 BlockManager (ref counts, hashes, free queue)."""
    ids = range(bm.num_blocks)
    lines = ["  block    " + " ".join(f"{i:>6}" for i in ids),
             "  ref      " + " ".join(f"{bm.get_ref_count(i):>6}" for i in ids),
             "  hash     " + " ".join(f"{_short(bm.blocks[i].block_hash):>6}" for i in ids),
             f"  free queue (head = next to hand out): {bm.free_block_queue.block_ids()}",
             f"  num_free_blocks={bm.num_free_blocks}  num_cached_blocks={bm.num_cached_blocks}"]
    return "\n".join(lines)


def draw_pool(pool) -> str:
    """Returns a text picture of a Lab 2 KVCachePool (rows, block tables, ref counts)."""
    lines = []
    for seq_id in sorted(pool.seq_ids):
        row = pool.get_row(seq_id)
        table = [int(b) for b in pool.block_tables[row].tolist()]
        refs = {b: pool.block_manager.get_ref_count(b) for b in pool.get_block_table(seq_id)}
        lines.append(f"  seq {seq_id}: row {row}  context_len={pool.get_context_len(seq_id):<3} "
                     f"table row {table}  ref counts {refs}")
    lines.append(f"  num_free_blocks={pool.num_free_blocks}  num_free_rows={pool.num_free_rows}")
    return "\n".join(lines or ["  (no sequence)"])


def _lab1_steps(impl):
    bm = impl.BlockManager(6)
    hashes = impl.hash_prompt_blocks(list(range(8)), 4)
    yield "BlockManager(6)", bm
    yield "allocate_n(3) -> seq A", (bm, a := bm.allocate_n(3))[0]
    for block_id, h in zip(a, hashes):
        bm.cache_block(block_id, h)
    yield f"cache_block the first two (full) blocks of A", bm
    yield "increase_ref_count(A[0]) (seq B shares it)", (bm, bm.increase_ref_count(a[0]))[0]
    yield "free_blocks(A) (A finishes)", (bm, bm.free_blocks(a))[0]
    yield "get_computed_blocks(A's hashes) (seq C has A's prompt)", (bm, bm.get_computed_blocks(hashes))[0]
    yield "allocate_n(4) (evicts from the head)", (bm, bm.allocate_n(bm.num_free_blocks))[0]


def _lab2_steps(impl):
    import torch

    pool = impl.KVCachePool(8, 4, 1, 8, dtype=torch.float32, max_num_seqs=3, max_model_len=24,
                            device="cpu")
    yield "KVCachePool(8 blocks of 4 tokens, 3 rows)", pool
    yield "add_sequence(0, 6)", (pool, pool.add_sequence(0, 6))[0]
    yield "append_tokens(0, 2) (fills block 2 of seq 0)", (pool, pool.append_tokens(0, 2))[0]
    yield "append_tokens(0, 1) (needs a new block)", (pool, pool.append_tokens(0, 1))[0]
    yield "fork(0, 1) (shares every block)", (pool, pool.fork(0, 1))[0]
    yield "append_tokens(1, 1) (copy-on-write of the shared partial block)", (pool, pool.append_tokens(1, 1))[0]
    yield "free_sequence(0)", (pool, pool.free_sequence(0))[0]


def main(args: argparse.Namespace) -> int:
    lab = resolve_labs([args.lab])[0]
    scenarios = {"lab01_block_manager": (_lab1_steps, draw_block_manager),
                 "lab02_kv_cache_pool": (_lab2_steps, draw_pool)}
    if lab not in scenarios:
        print(f"pagedlab show: draws Lab 1 and Lab 2 (not {lab})", file=sys.stderr)
        return 2
    try:
        impl = load_impl(lab)
    except LabImplError as exc:
        print(f"pagedlab: {exc}", file=sys.stderr)
        return 2
    steps, draw = scenarios[lab]
    print(f"{lab}, {describe_impl()}")
    gen = steps(impl)
    number = 0
    while True:
        try:
            title, state = next(gen)
        except StopIteration:
            return 0
        except Exception as exc:  # the student's code raised: show where the scenario stopped
            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(f"\nstep {number + 1} raised {type(exc).__name__}: {exc}\n"
                  f"  (at {where.filename.split('/labs/')[-1]}:{where.lineno})")
            return 1
        number += 1
        print(f"\nstep {number}: {title}")
        try:
            print(draw(state))
        except Exception as exc:
            print(f"  (cannot draw the state: {type(exc).__name__}: {exc})")
            return 1
