"""The decode benchmark's workloads (Lab 4): fixed shapes, so figures compare across runs.

All use fp16 K/V, head size 128 and 16-token blocks. ``context_lens`` draws the ragged one
from its own seed, so every run and every machine benchmarks the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DecodeWorkload:
    """One decode step to benchmark.

    Attributes:
        name: short label used in tables and plots.
        description: what the shape stands for.
        num_seqs: sequences in the batch (one query token each).
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        context_len: every sequence's length, or (low, high) for lengths uniform in [low, high].
        head_size: elements per head vector.
        block_size: tokens per KV block.
        seed: seed of the ragged lengths.
    """

    name: str
    description: str
    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    context_len: int | tuple[int, int]
    head_size: int = 128
    block_size: int = 16
    seed: int = 0

    def context_lens(self) -> np.ndarray:
        """Returns the batch's context lengths, [num_seqs] int32."""
        if isinstance(self.context_len, tuple):
            low, high = self.context_len
            rng = np.random.default_rng(self.seed)
            return rng.integers(low, high + 1, size=self.num_seqs).astype(np.int32)
        return np.full(self.num_seqs, self.context_len, dtype=np.int32)

    def kv_bytes(self) -> int:
        """K and V bytes a decode step must read: every cached token's K and V rows, fp16."""
        return int(self.context_lens().astype(np.int64).sum()) * self.num_kv_heads * self.head_size * 2 * 2


DECODE_WORKLOADS = (
    DecodeWorkload("D1", "64 seqs x 4096, GQA 32q/8kv: a busy server, mid-length chats",
                   64, 32, 8, 4096),
    DecodeWorkload("D2", "32 seqs x 2048, MHA 32 heads: no GQA sharing to exploit",
                   32, 32, 32, 2048),
    DecodeWorkload("D3", "4 seqs x 32768, GQA 32q/8kv: few long contexts (needs split-K)",
                   4, 32, 8, 32768),
    DecodeWorkload("V", "8 seqs x 4096, GQA 64q/8kv: a large group, a small batch",
                   8, 64, 8, 4096),
    DecodeWorkload("D4", "128 seqs, lengths uniform in [1, 8192], GQA 32q/8kv: ragged",
                   128, 32, 8, (1, 8192), seed=4),
    DecodeWorkload("D5", "256 seqs x 1024, GQA 32q/8kv: a large batch of short contexts",
                   256, 32, 8, 1024),
    DecodeWorkload("D6", "1 seq x 131,072, GQA 32q/8kv: one very long context (split-K only)",
                   1, 32, 8, 131072),
)

#: The context-length sweep behind the bandwidth-vs-context plot: 16 sequences, GQA 32q/8kv.
SWEEP_NUM_SEQS = 16
SWEEP_CONTEXT_LENS = (256, 512, 1024, 2048, 4096, 8192, 16384)

#: The production path's targets: ``plan_decode(...).run`` at least as fast as FlashInfer's
#: best decode path on the same cache, per workload, timed in alternation with it both as graph
#: replays and as eager calls (``paired.py``); at most HOST_US_TARGET µs of host time per
#: ``run``; and ``paged_attention`` at a fraction of the copy ceiling per workload.
TARGET_VS_FLASHINFER = 1.0
HOST_US_TARGET = 25.0
TARGET_OF_CEILING = {"D1": 0.85, "D2": 0.85, "D3": 0.80, "D4": 0.85}
