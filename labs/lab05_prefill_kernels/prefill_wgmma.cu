// Lab 5.6 — the Hopper paged prefill kernel (your task: TODO(lab5.6) below) (wgmma.mma_async + TMA, sm_90a; fp16/bf16 in, fp32 acc).
//
// The same work as prefill_tc.cu — work items (row tile, KV head), rows = (token, query head)
// pairs stacked token-major so one K/V tile serves the whole GQA group — on Hopper's warpgroup
// tensor cores, with the warps split by role ("warp specialisation") and the CTAs persistent:
//
//   The grid has at most one CTA per SM (G = gridDim.x). CTA b starts with item b, then takes
//   the next untaken one from a work counter in global memory (atomicAdd) until none is left:
//   a CTA that finishes early takes more, whatever the items' sizes (a dynamic scheduler). The
//   items go head-major (KV head, then the plan's heaviest-first order), so the CTAs running at
//   one time share one or two heads' K/V, which then stays in L2. A CTA's start-up is paid
//   once, and the next item's Q and first K tile load while the last item finishes.
//
//   warpgroup 0, the producer, only moves data: it takes the next item and names it in the slot
//   of the Q buffer it loads (the consumers read the slot), Q by cp.async into one of two
//   buffers, then K and V tiles of BN = 128 keys into a ring of STAGES = 2 stages each. Whole pages arrive by
//   TMA (one lane asks the copy engine for a page's rows; the engine writes them swizzled and
//   counts their bytes on the stage's mbarrier); the part of a tile past the context's last
//   whole page by cp.async, zero-filled past the context. It gives most of its registers away
//   (setmaxnreg.dec).
//
//   warpgroups 1 and 2, the consumers, 64 rows each (BM = 128), take those registers
//   (setmaxnreg.inc) and compute: S = Q K^T with Q and K straight from shared memory
//   (descriptors), then O += P V with P from registers (the S accumulators, converted in place)
//   and V read "transposed" (MN-major). Per consumer the work is software-pipelined: S of tile
//   t and P V of tile t - 1 are issued together, and the softmax of tile t (CUDA cores) is
//   meant to run while the tensor cores do P V. NOTE: ptxas (CUDA 13) moves the wait for P V
//   up to near the softmax's start (the SASS shows it; the handout's "Measure it yourself").
//   Pinned back after the softmax, it ran no faster: the other consumer's S and P V already
//   keep the tensor cores busy while this one does its softmax.
//
//   Every buffer changes hands through mbarriers: full_k[s] / full_v[s] / q_full[b] complete
//   when a tile has landed (q_full[b] also publishes slot b), empty_k[s] / empty_v[s] /
//   q_empty[b] when every consumer warp has finished reading it (K after its S, V after its
//   P V, one tile later, Q after the item's last S). The K/V rings run on across items: g, a
//   CTA's running tile count, names the stage (g % STAGES) and the phase (g / STAGES).
//
// Shared memory holds every tile in the 128-byte swizzle layout wgmma reads (sw_off below),
// which is also the layout TMA writes with the tensor maps the launcher passes
// (reference/tma.py: box of 64 columns x min(block_size, BN) rows, 128-byte swizzle).
// Measured on an H100, 2026-11-25 (P3 / P4, TFLOP/s, a scratch harness that reads ~3 % above
// `pagedlab bench prefill`): every thread copying by cp.async, three
// warpgroups of 64 rows, 64-key tiles 418 / 340; a cp.async producer warpgroup 250-320 (its
// address arithmetic and copies were the bottleneck: with the copies skipped the consumers ran
// 540); the TMA producer 451 / 435; persistent CTAs with a static zigzag 471 / 431, and P1 / P2
// / P6 260 -> 282, 406 -> 425, 44 -> 59; then the work counter and head-major items: P2 +1-2 %,
// P4 +1 %, P5 (two 4096-token MHA prompts, whose heads' K/V outgrew L2) +3-5 %. The committed
// benchmark: P1-P6 285 / 401 / 445 / 418 / 395 / 65, 0.94-0.98x FlashInfer's fa3 backend on
// P1-P5. Then the producer's block-table reads moved ahead of its stage waits: on an H200,
// 0.96-1.01x (P1-P5 296 / 403 / 456 / 430 / 409).
#include "pagedlab_ptx.cuh"    // cp_async_*, smem_addr
#include "pagedlab_wgmma.cuh"  // wgmma_*, wgmma_desc, fence_*, mbar_*, tma_load_2d/4d, setmaxnreg_*
#include "prefill_common.cuh"   // MmaType<T>::pack, fast_exp2

namespace pagedlab {

// Tile row r's 16-byte chunk ch in the 128-byte-swizzle layout (tile of R rows): the head
// dimension cut into 64-element (128-byte) column blocks of R rows each; in each, row r's chunk
// j sits at chunk j ^ (r % 8) of its 128 bytes.
template <int R>
__device__ __forceinline__ unsigned sw_off(int r, int ch) {
  return (ch / 8) * (R * 128) + r * 128 + (((ch % 8) ^ (r % 8)) * 16);
}

template <typename T, int D, int BN, int STAGES, int CONSUMERS, int PRODUCER_REGS, int CONSUMER_REGS>
__device__ void prefill_wgmma(T* __restrict__ out,                // [num_tokens, num_q_heads, D]
                              const T* __restrict__ query,        // [num_tokens, num_q_heads, D]
                              const T* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, D]
                              const T* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, D]
                              const int* __restrict__ block_tables,  // [num_seqs, max_blocks_per_seq]
                              const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1]
                              const int* __restrict__ context_lens,  // [num_seqs]
                              const float* __restrict__ alibi_slopes,  // [num_q_heads] or nullptr
                              const int* __restrict__ work,          // [num_work, 2] (seq_idx, row_start)
                              float scale, int num_q_heads, int num_kv_heads, int block_size,
                              int max_blocks_per_seq, int causal,
                              const TmaDesc& key_map,     // key_cache as [rows, D], box [min(block_size, BN), 64] (or whole rows: see below)
                              const TmaDesc& value_map,   // value_cache, the same
                              int num_items,              // work items x KV heads
                              int* __restrict__ sched) {  // [2] item counter, CTAs done: zero at launch
  // TODO(lab5.6): the Hopper kernel. Work items are (row tile, KV head) pairs, idx in
  // 0 .. num_items - 1, head-major: with num_work = num_items / num_kv_heads, item = idx %
  // num_work, kv_head = idx / num_work (rows = (token, query head) pairs of the GQA group, as in
  // prefill_tc.cu); BM = 64 * CONSUMERS rows. Persistent and dynamic: CTA b's first item is b,
  // each next one gridDim.x + atomicAdd(&sched[0], 1), until idx >= num_items. Warpgroup 0
  // (threads 0..127) is the producer; warpgroup 1 + c (c < CONSUMERS) is consumer c and owns
  // rows 64 c .. 64 c + 63.
  // Shared memory (wgmma_shared_bytes): round the base up to 1024 bytes; then two Q buffers
  // [BM rows] (item n uses buffer n % 2), STAGES K tiles, STAGES V tiles [BN rows each], every
  // tile in the 128-byte swizzle layout (sw_off<rows>); then mbarriers: full_k, full_v [STAGES]
  // (count 129: the producer's 128 cp.async arrivals + the one that announces the TMA bytes),
  // empty_k, empty_v [STAGES] (count 4 * CONSUMERS: one per consumer warp), q_full [2] (count
  // 129: 128 cp.async arrivals + thread 0's, which publishes the slot), q_empty [2] (count
  // 4 * CONSUMERS); then two slots (at most WGMMA_SLOT_BYTES each) saying which item Q buffer b
  // holds (its idx and what the consumers need of it; a consumer copies it once, after q_full). One thread initialises the barriers, then
  // fence_mbarrier_init() (the copy engine must see them too), then __syncthreads().
  // The K/V rings run on across items: with g = (tiles of the CTA's earlier items) + tile,
  // stage g % STAGES, phase parity (g / STAGES) & 1.
  //   producer: setmaxnreg_dec<PRODUCER_REGS>(); per item n: from the third on, wait q_empty of
  //     its buffer; thread 0 takes the item's idx and writes it to slot n % 2;
  //     named_bar_sync(1, 128); all read it. If idx >= num_items: thread 0 mbar_arrive(q_full),
  //     every thread mbar_arrive_cp_async(q_full) (the consumers then read "none left"), stop.
  //     Else thread 0 writes the item to the slot, cp.async Q (rows past the sequence: zeros),
  //     thread 0 mbar_arrive(q_full) (a release: the slot is seen with Q), everyone
  //     mbar_arrive_cp_async(q_full). Then K 0, and for each tile t: K t + 1, V t — each into its
  //     stage after waiting, from the stage's second use on, for empty (parity of the previous
  //     use). Filling one tile: cut it into boxes of box_rows = min(block_size, BN) keys; thread
  //     0 mbar_arrive_expect_tx(full, bytes of the boxes wholly inside the context);
  //     __syncwarp(); lane j of warp 0 loads box j with tma_load_2d (one per 64 columns: column
  //     c * 64, cache row (block * num_kv_heads + kv_head) * block_size + slot, to the box's
  //     place in the tile); the rows after the last whole box by cp.async (zeros past kv_len);
  //     then every producer thread mbar_arrive_cp_async(full). (Faster: read tile t + 1's
  //     pages from the block table before its K waits for the stage, so the load's latency
  //     hides under the wait, and keep them for its V. Faster still: lay K's and V's tiles
  //     out in 8-row groups of whole rows, [BN / 8][D / 64][8][64] (row r's chunk ch at
  //     (r / 8) * 16 * D + (ch / 8) * 1024 + (r % 8) * 128 + ((ch % 8) ^ (r % 8)) * 16, the
  //     cp.async rows after the last box too), and load each box with one request from the
  //     maps tensor_map(cache, box_rows, whole_rows=True): tma_load_4d(dst, map, 0, 0, 0,
  //     cache row / 8, full) at D = 128, box j at tile + j * box_rows * 2 * D (the same at
  //     D = 64); at D = 64 those maps are 2-D, the layout is
  //     sw_off<BN>'s and the load tma_load_2d(dst, map, 0, cache row, full). A page is then one
  //     request instead of D / 64; K's and V's descriptors then take stride 16 * D (the 8-row
  //     groups), V's leading offset 1024, K's column block kd / 4 at + 1024, V's k16 step kk at
  //     + kk * 32 * D; Q keeps sw_off<BM> and stride 1024.) At the end cp_async_wait<0>();
  //     then thread 0: __threadfence(); the CTA whose atomicAdd(&sched[1], 1) returns
  //     gridDim.x - 1 fences again and zeroes sched[0] and sched[1] for the next launch.
  //   consumers: setmaxnreg_inc<CONSUMER_REGS>(); per item n: wait q_full of buffer n % 2
  //     (parity (n / 2) & 1); read the slot (stop if idx >= num_items); O, m, l reset;
  //     loop t: mbar_wait full_k of t (and, for t > 0, full_v of t - 1);
  //     fence_proxy_async();
  //     S = Q K^T: wgmma_fence(); D / 16 x wgmma_ss(WgmmaShape<BN>, ...), descriptors
  //     with swizzle mode 1 (K-major: k16 step = +32 bytes inside a 128-byte row, next
  //     64-column block at + rows * 128; stride 1024); wgmma_commit();
  //     if t > 0: O += P V of tile t - 1 (BN / 16 x wgmma_rs_tb, V MN-major: leading
  //     offset BN * 128, stride 1024; commit), then wgmma_wait<1>(); else wgmma_wait<0>();
  //     lane 0 of each warp releases K of t (mbar_arrive on empty_k), and Q after the last t;
  //     mask / ALiBi / online softmax on S exactly as in prefill_tc.cu (the accumulator
  //     layout is mma.sync's, repeated along N); wgmma_wait<0>(); lane 0 releases V of t - 1;
  //     rescale O; pack P.
  //   after the loop: O += P V of the last tile (wait for its V first, release it after);
  //   O / l -> out (rows past the sequence: not written).
  // reg_fence every accumulator register around each wait (the compiler does not know wgmma
  // is asynchronous).
}

}  // namespace pagedlab

// One producer warpgroup + CONSUMERS consumer warpgroups. Registers: the launch bound gives each
// of the 384 threads 168; the producer drops to 56 and the consumers rise to 224
// (128 x 56 + 256 x 224 = 384 x 168: the CTA's budget moved, not grown). NOTE: at 40 the
// producer spilled a register once it kept the next tile's pages.
#define PAGEDLAB_WGMMA(NAME, T, D)                                                                  \
  extern "C" __global__ void __launch_bounds__(384, 1)                                              \
  NAME(T* out, const T* query, const T* key_cache, const T* value_cache, const int* block_tables,  \
       const int* cu_seqlens_q, const int* context_lens, const float* alibi_slopes,                \
       const int* work, float scale, int num_q_heads, int num_kv_heads, int block_size,            \
       int max_blocks_per_seq, int causal, const __grid_constant__ pagedlab::TmaDesc key_map,      \
       const __grid_constant__ pagedlab::TmaDesc value_map, int num_items, int* sched) {           \
    pagedlab::prefill_wgmma<T, D, 128, 2, 2, 56, 224>(out, query, key_cache, value_cache,          \
                                                      block_tables, cu_seqlens_q, context_lens,    \
                                                      alibi_slopes, work, scale, num_q_heads,      \
                                                      num_kv_heads, block_size,                    \
                                                      max_blocks_per_seq, causal, key_map,         \
                                                      value_map, num_items, sched);                \
  }

// Kernel names: prefill_wgmma_<dtype>_d<head_size>; BN = 128 keys, 2 stages, 2 consumers.
PAGEDLAB_WGMMA(prefill_wgmma_f16_d64, __half, 64)
PAGEDLAB_WGMMA(prefill_wgmma_f16_d128, __half, 128)
PAGEDLAB_WGMMA(prefill_wgmma_bf16_d64, __nv_bfloat16, 64)
PAGEDLAB_WGMMA(prefill_wgmma_bf16_d128, __nv_bfloat16, 128)
