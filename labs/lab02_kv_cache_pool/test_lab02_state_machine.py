"""Lab 2: the whole pool under random add / append / fork / free, against a model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from labs.lab02_kv_cache_pool._state import (check_invariants, gather_kv_each, poison, snapshot,
                                             tables_and_counts)
from reference.errors import (
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceTooLongError,
    TooManySequencesError,
    UnknownSequenceError,
)
from reference.layout import num_blocks_for

NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE = 10, 4, 2, 3
MAX_SEQS, MAX_LEN = 4, 14
SEQ_IDS = st.integers(0, 5)


def _machine(impl, device):
    class PoolMachine(RuleBasedStateMachine):
        """Random life cycles; a model predicts tokens, sharing and errors.

        The model gives every physical block a *label*. A fork copies the parent's labels; a
        copy-on-write replaces the last label by a fresh one. Two sequences must then share a
        physical block exactly when they share a label, and the pool's free count is
        NUM_BLOCKS minus the labels in use. Every token's K/V is a distinct number, so a
        gather shows any write that went to the wrong place.
        """

        def __init__(self):
            super().__init__()
            self.pool = impl.KVCachePool(NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE,
                                         max_num_seqs=MAX_SEQS, max_model_len=MAX_LEN,
                                         dtype=torch.float32, device=device)
            poison(self.pool)
            self.tokens: dict[int, list[int]] = {}  # seq -> token values, in order
            self.labels: dict[int, list[int]] = {}  # seq -> model block labels
            self.next_label = 0
            self.next_value = 1

        # ----------------------------------------------------------- model helpers

        def free_model_blocks(self):
            return NUM_BLOCKS - len({lab for labs in self.labels.values() for lab in labs})

        def fresh_labels(self, n):
            self.next_label += n
            return list(range(self.next_label - n, self.next_label))

        def shared(self, seq, label):
            return any(label in labs for s, labs in self.labels.items() if s != seq)

        def expect_refusal(self, call, errors):
            before = snapshot(self.pool)
            with pytest.raises(tuple(errors)):
                call()
            assert snapshot(self.pool) == before, f"refused call ({errors}) changed the pool"

        def write_new_tokens(self, seq, n):
            values = list(range(self.next_value, self.next_value + n))
            self.next_value += n
            self.tokens[seq] += values
            grid = torch.arange(HEADS * HEAD_SIZE, dtype=torch.float32).view(HEADS, HEAD_SIZE)
            key = torch.tensor(values, dtype=torch.float32).view(n, 1, 1) * 100 + grid
            slots = self.pool.slot_mapping([seq], [n])
            self.pool.write_kv(slots, key.to(self.pool.device), (-key).to(self.pool.device))

        # ------------------------------------------------------------------ rules

        @rule(seq=SEQ_IDS, n=st.integers(0, MAX_LEN + 2))
        def add(self, seq, n):
            errors = []
            if seq in self.tokens:
                errors.append(DuplicateSequenceError)
            if n > MAX_LEN:
                errors.append(SequenceTooLongError)
            if len(self.tokens) == MAX_SEQS:
                errors.append(TooManySequencesError)
            if num_blocks_for(n, BLOCK_SIZE) > self.free_model_blocks():
                errors.append(OutOfBlocksError)
            if errors:
                self.expect_refusal(lambda: self.pool.add_sequence(seq, n), errors)
                return
            self.pool.add_sequence(seq, n)
            self.tokens[seq], self.labels[seq] = [], self.fresh_labels(num_blocks_for(n, BLOCK_SIZE))
            if n:
                self.write_new_tokens(seq, n)

        @rule(seq=SEQ_IDS, n=st.integers(1, 2 * BLOCK_SIZE + 1))
        def append(self, seq, n):
            if seq not in self.tokens:
                self.expect_refusal(lambda: self.pool.append_tokens(seq, n), [UnknownSequenceError])
                return
            old = len(self.tokens[seq])
            cow = old % BLOCK_SIZE != 0 and self.shared(seq, self.labels[seq][-1])
            extra = num_blocks_for(old + n, BLOCK_SIZE) - len(self.labels[seq])
            errors = []
            if old + n > MAX_LEN:
                errors.append(SequenceTooLongError)
            if extra + cow > self.free_model_blocks():
                errors.append(OutOfBlocksError)
            if errors:
                self.expect_refusal(lambda: self.pool.append_tokens(seq, n), errors)
                return
            self.pool.append_tokens(seq, n)
            if cow:
                self.labels[seq][-1] = self.fresh_labels(1)[0]
            self.labels[seq] += self.fresh_labels(extra)
            self.write_new_tokens(seq, n)

        @rule(parent=SEQ_IDS, child=SEQ_IDS)
        def fork(self, parent, child):
            errors = []
            if parent not in self.tokens:
                errors.append(UnknownSequenceError)
            if child in self.tokens:
                errors.append(DuplicateSequenceError)
            if len(self.tokens) == MAX_SEQS:
                errors.append(TooManySequencesError)
            if errors:
                self.expect_refusal(lambda: self.pool.fork(parent, child), errors)
                return
            self.pool.fork(parent, child)
            self.tokens[child] = list(self.tokens[parent])
            self.labels[child] = list(self.labels[parent])

        @rule(seq=SEQ_IDS)
        def free(self, seq):
            if seq not in self.tokens:
                self.expect_refusal(lambda: self.pool.free_sequence(seq), [UnknownSequenceError])
                return
            self.pool.free_sequence(seq)
            del self.tokens[seq], self.labels[seq]

        # ------------------------------------------------------------- invariants

        @invariant()
        def pool_is_consistent(self):
            check_invariants(self.pool)

        @invariant()
        def sharing_and_counts_match_the_model(self):
            # one read of the pool (one round trip when graded isolated)
            seq_ids, num_free_blocks, tables = tables_and_counts(self.pool)
            assert sorted(seq_ids) == sorted(self.tokens)
            assert num_free_blocks == self.free_model_blocks(), (
                f"num_free_blocks = {num_free_blocks}, the model expects "
                f"{self.free_model_blocks()}"
            )
            label_to_block, block_to_label = {}, {}
            for seq, labels in self.labels.items():
                table = tables[seq]
                assert len(table) == len(labels), f"seq {seq}: {table} vs model {labels}"
                for lab, block in zip(labels, table):
                    assert label_to_block.setdefault(lab, block) == block, (
                        f"seq {seq}: a block the model says is shared is not the same physical "
                        f"block in every sharer"
                    )
                    assert block_to_label.setdefault(block, lab) == lab, (
                        f"seq {seq}: physical block {block} is shared where the model says it "
                        f"must have been copied (copy-on-write) or never shared"
                    )

        @invariant()
        def every_sequence_gathers_its_own_tokens(self):
            grid = torch.arange(HEADS * HEAD_SIZE, dtype=torch.float32).view(HEADS, HEAD_SIZE)
            seqs = list(self.tokens)
            for (seq, values), (got_k, got_v) in zip(self.tokens.items(),
                                                     gather_kv_each(self.pool, seqs)):
                want = torch.tensor(values, dtype=torch.float32).view(-1, 1, 1) * 100 + grid
                assert torch.equal(got_k.cpu(), want), (
                    f"seq {seq}: gathered keys {got_k[:, 0, 0].cpu().tolist()} (÷100 = token), "
                    f"expected tokens {values}"
                )
                assert torch.equal(got_v.cpu(), -want), f"seq {seq}: values"

    return PoolMachine


@pytest.mark.points(4)
def test_random_life_cycles_keep_every_invariant(impl, device):
    """Under random add / append / fork / free (valid or not): ref counts equal the number of
    sequences holding each block, num_free_blocks matches a model, sequences share a physical
    block exactly when the model says (fork shares, copy-on-write unshares), every sequence
    gathers exactly its own tokens, and every refused call leaves the pool unchanged."""
    run_state_machine_as_test(
        _machine(impl, device), settings=settings(max_examples=60, stateful_step_count=30)
    )
