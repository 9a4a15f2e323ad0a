// v5 — tensor cores (Task 4.5): v4's split-K walk, with both products on mma.sync.
//
// v4 streams K/V at the copy ceiling for MHA, but with a GQA group of 4 or 8 every K/V element
// feeds 4-8 fp32 multiply-adds, shuffle reductions and conversions: the CUDA cores, not memory,
// set the pace. Here a warp takes 16 tokens at a time and lets the tensor cores do the products
// (mma.sync.m16n8k16, fp16/bf16 in, fp32 accumulate):
//     S[heads x 16 tokens] = Q[heads x D] . K^T        (rows: the CTA's query heads, padded to 16)
//     O[heads x D]        += P[heads x 16 tokens] . V   (P = 2^(S - m), rounded to fp16/bf16)
// No lane needs a fragment shuffle or a shared-memory transpose, thanks to two free choices:
//   * the dot product's k order is arbitrary: a lane that loads 8 consecutive columns of a K row
//     (one 16-byte vector) pairs them with the same 8 columns of Q, in two k16 steps;
//   * the output's column order is ours to pick: lane (g, t) loads V columns 64h + 8g .. +8 of
//     four token rows and uses element e of them as n8-chunk (h, e), column g — the packing of
//     two tokens into one register is one byte permute.
// The score fragment of S has exactly the layout P needs as the A operand of the second product
// (rows = heads by lane / 4, columns = tokens by lane % 4), so P never leaves registers.
#include "decode_common.cuh"

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 4
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define TILE_TOKENS 16             // tokens per warp iteration: the k of the P.V product
#define K_CHUNKS (HEAD_SIZE / 32)  // a lane's 16-byte vectors per K row
#define V_HALVES (HEAD_SIZE / 64)  // a lane's 16-byte vectors per V row
#define O_CHUNKS (HEAD_SIZE / 8)   // n8 chunks of the output row
#ifndef MAX_PARTITION_SIZE
#define MAX_PARTITION_SIZE 1024
#endif
#define MAX_PARTITION_BLOCKS (MAX_PARTITION_SIZE / BLOCK_SIZE)

static_assert(HEAD_SIZE == 64 || HEAD_SIZE == 128, "v5 has code for head sizes 64 and 128");
static_assert(HEADS_PER_CTA <= 8, "the A operand's rows 8..15 are kept zero");

// d += A . B for one m16n8k16 tile; rows 8..15 of A (fragment registers a1, a3) are zero.
__device__ __forceinline__ void mma_16816(float (&d)[4], unsigned a0, unsigned a2, unsigned b0,
                                          unsigned b1, const __half*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], unsigned a0, unsigned a2, unsigned b0,
                                          unsigned b1, const __nv_bfloat16*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// grid (num_seqs, num_q_heads / HEADS_PER_CTA, num_partitions), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v5(
    scalar_t* __restrict__ out,                // [num_seqs, num_q_heads, head_size]
    float* __restrict__ lse,                   // [num_seqs, num_q_heads] or null; natural log
    float* __restrict__ part_m,                // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_l,                // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_acc,              // [num_seqs, num_q_heads, num_partitions, head_size]
    const scalar_t* __restrict__ query,        // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
    const scalar_t* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
    const int* __restrict__ block_tables,      // [num_seqs, max_blocks_per_seq]
    const int* __restrict__ context_lens,      // [num_seqs]
    const int max_blocks_per_seq, const int num_kv_heads, const int group, const float scale,
    const int partition_size) {
  // TODO(lab4.5): v4's partition walk, 16 tokens per warp iteration, products on tensor cores.
  //  Lane (g, t) = (lane / 4, lane % 4). Load once: Q as the A operand (head g, the columns
  //  p0..p0+3 with p0 = 32 (kk / 2) + 8 t + 4 (kk % 2) for each k16 step kk; heads >= HEADS_PER_CTA
  //  zero). Per tile: K rows t0 + 8j + g (columns 32c + 8t, one 16-byte vector per chunk c) and
  //  V rows t0 + {2t, 2t+1, 2t+8, 2t+9} (columns 64h + 8g); S = Q K^T with mma_16816 (two n8
  //  tiles of tokens); scale, mask past `end`, online softmax for head g (max over the 4 lanes of
  //  the group: xor 1, 2); pack P with pack2 (it is already the A fragment); O += P V with the
  //  B fragments made by __byte_perm of two V rows' words: n8 tile (h, e), for e < 8, pairs
  //  element e of the V vectors, so its B column g is output column 64h + 8g + e, and lane
  //  (g, t)'s two accumulators (C columns 2t, 2t+1) are head g's columns 64h + 16t + e and
  //  64h + 16t + e + 8. Then merge the warps as v4 does (s_acc `__shared__ __align__(16)`:
  //  merge_warps_and_store reads it as float4).
}
