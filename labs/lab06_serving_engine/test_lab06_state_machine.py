"""Lab 6: the scheduler's invariants under random arrivals, checked after every step."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from labs.lab06_serving_engine._cases import check_block_invariants, paged_model

NUM_BLOCKS, BLOCK_SIZE, BUDGET, MAX_SEQS = 10, 4, 6, 3
#: a few shared prefixes, so prefix-cache hits and shared blocks happen often
PREFIXES = [[7, 7, 7, 7, 8, 8, 8, 8], [1, 2, 3, 4], []]


def _machine(impl):
    class EngineMachine(RuleBasedStateMachine):
        """Requests arrive at random moments between steps; a small pool and budget force
        chunked prefill, preemption and prefix sharing. After every step: ref counts equal the
        tables' holdings, nothing finished holds a block, the budget and max_num_seqs hold,
        every scheduled request's table covers exactly its tokens; at the end all is free."""

        def __init__(self):
            super().__init__()
            self.llm = impl.LLM(paged_model(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                                max_num_batched_tokens=BUDGET, max_num_seqs=MAX_SEQS)
            self.expected_len: dict[int, int] = {}  # seq_id -> prompt + max_tokens
            self.finished: set[int] = set()

        @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 255), min_size=1, max_size=9),
              max_tokens=st.integers(1, 6))
        def arrive(self, prefix, tail, max_tokens):
            prompt = (prefix + tail)[:40 - max_tokens]
            seq_id = self.llm.add_request(prompt, impl.SamplingParams(max_tokens=max_tokens))
            self.expected_len[seq_id] = len(prompt) + max_tokens

        @precondition(lambda self: self.llm.has_unfinished_requests())
        @rule()
        def step(self):
            for out in self.llm.step():
                assert out.seq_id not in self.finished, f"request {out.seq_id} finished twice"
                self.finished.add(out.seq_id)
                got = len(out.prompt_token_ids) + len(out.output_token_ids)
                assert got == self.expected_len[out.seq_id], (
                    f"request {out.seq_id} finished with {got} tokens, expected prompt + max_tokens "
                    f"= {self.expected_len[out.seq_id]}")
            scheduled = self.llm.last_scheduled
            num_tokens = sum(n for _, n in scheduled)
            assert 0 < num_tokens <= BUDGET, (
                f"a step scheduled {num_tokens} tokens, budget {BUDGET}: cap every prompt chunk by "
                "the budget left")
            assert len(self.llm.scheduler.running) <= MAX_SEQS, "more running requests than max_num_seqs"
            ids = [s.seq_id for s, _ in scheduled]
            assert len(ids) == len(set(ids)), f"a request was scheduled twice in one step: {ids}"
            for seq, _ in scheduled:
                if seq.status.value == "running":
                    want = -(-seq.num_computed_tokens // BLOCK_SIZE)
                    assert len(seq.block_table) == want, (
                        f"request {seq.seq_id} holds {len(seq.block_table)} blocks for "
                        f"{seq.num_computed_tokens} computed tokens (expected {want})")

        @invariant()
        def blocks_are_accounted_for(self):
            check_block_invariants(self.llm)

        def teardown(self):
            while self.llm.has_unfinished_requests():
                self.llm.step()
                check_block_invariants(self.llm)
            bm = self.llm.block_manager
            refs = [bm.allocator.get_ref_count(b) for b in range(NUM_BLOCKS)]
            assert refs == [0] * NUM_BLOCKS and bm.num_free_blocks == NUM_BLOCKS, (
                f"after every request finished, ref counts are {refs}: blocks leaked")

    return EngineMachine


@pytest.mark.points(6)
def test_random_arrivals_keep_scheduler_invariants(impl):
    """Hypothesis state machine over random arrival patterns (see EngineMachine): no block is
    leaked or double-owned, ref counts return to zero, the token budget is respected."""
    run_state_machine_as_test(_machine(impl),
                              settings=settings(max_examples=25, stateful_step_count=25))
