// Lab 5.6 — the Hopper paged prefill kernel (wgmma.mma_async + TMA, sm_90a; fp16/bf16 in, fp32 acc).
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
// Shared memory holds every tile in the 128-byte swizzle layout wgmma reads: Q's (sw_off below)
// in 64-column blocks of BM rows; K's and V's (kv_off) in 8-row groups of whole rows, each group
// its D / 64 column blocks one after the other. That is what TMA writes with the maps the
// launcher passes (reference/tma.py, whole_rows=True: a box of min(block_size, BN) whole rows,
// 128-byte swizzle), so a page of K or of V is one TMA request (at head size 128, 16 requests
// per K and V tile of 16-token pages; 64-column boxes need 32), and the groups sit 16 * D bytes
// apart across pages, the one stride wgmma's descriptors can describe.
// Measured on an H100, 2026-11-25 (P3 / P4, TFLOP/s, a scratch harness that reads ~3 % above
// `pagedlab bench prefill`): every thread copying by cp.async, three
// warpgroups of 64 rows, 64-key tiles 418 / 340; a cp.async producer warpgroup 250-320 (its
// address arithmetic and copies were the bottleneck: with the copies skipped the consumers ran
// 540); the TMA producer 451 / 435; persistent CTAs with a static zigzag 471 / 431, and P1 / P2
// / P6 260 -> 282, 406 -> 425, 44 -> 59; then the work counter and head-major items: P2 +1-2 %,
// P4 +1 %, P5 (two 4096-token MHA prompts, whose heads' K/V outgrew L2) +3-5 %. The committed
// benchmark: P1-P6 285 / 401 / 445 / 418 / 395 / 65, 0.94-0.98x FlashInfer's fa3 backend on
// P1-P5. Then the producer's block-table reads moved ahead of its stage waits: on an H200,
// 0.96-1.01x (P1-P5 296 / 403 / 456 / 430 / 409). Then V by whole-row page boxes: on an H200,
// 2026-11-29, against the kernel before in the same run (alternating, two runs each), P1-P5
// +3-5 % (303-308 / 418-426 / 478-481 / 444-445 / 423-428 TFLOP/s), outputs bitwise equal;
// FlashInfer in one bench run: 1.03 / 1.01 / 1.03 / 1.01 / 0.99x. Then K too, both in 8-row
// groups (kv_off): the same day, the same way, +3-6 % (309-317 / 438-440 / 504 / 466-468 /
// 443-444), outputs bitwise equal; FlashInfer in one bench run: 1.05 / 1.06 / 1.09 / 1.07 /
// 1.06x (314 / 448 / 518 / 474 / 458 TFLOP/s).
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

// K's and V's tiles go in 8-row groups instead: group r / 8 holds its rows' D columns as D / 64
// column blocks of 8 rows, [BN / 8][D / 64][8][64], each row swizzled as in sw_off. A box of
// whole rows (any multiple of 8) is then a run of whole groups: what one TMA request of the
// whole_rows map writes. At D = 64 this is sw_off<BN>.
template <int D>
__device__ __forceinline__ unsigned kv_off(int r, int ch) {
  return (r / 8) * (16 * D) + (ch / 8) * 1024 + (r % 8) * 128 + (((ch % 8) ^ (r % 8)) * 16);
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
                              const TmaDesc& key_map,     // key_cache, boxes of whole rows (whole_rows=True)
                              const TmaDesc& value_map,   // value_cache, the same
                              int num_items,              // work items x KV heads
                              int* __restrict__ sched) {  // [2] item counter, CTAs done: zero at launch
  constexpr int BM = 64 * CONSUMERS;
  constexpr int CH = D / 8;            // 16-byte chunks per row
  constexpr int NT = BN / 8;           // 8-key n-tiles of S
  constexpr int DT = D / 8;            // 8-dim n-tiles of O
  constexpr unsigned TILE_BYTES = BN * D * 2;  // one K or V tile
  constexpr float LOG2E = 1.4426950408889634f;
  constexpr int PRODUCER_THREADS = 128;
  constexpr unsigned CONSUMER_WARPS = 4 * CONSUMERS;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // NOTE: the swizzle is a function of address bits 4-9: tiles start 1024-byte aligned.
  const unsigned q_s0 = (smem_addr(smem_raw) + 1023u) & ~1023u;  // [2][BM rows]
  const unsigned k_s0 = q_s0 + 2 * BM * D * 2;                     // [STAGES][BN rows]
  const unsigned v_s0 = k_s0 + STAGES * TILE_BYTES;               // [STAGES][BN rows]
  const unsigned full_k = v_s0 + STAGES * TILE_BYTES, full_v = full_k + 8 * STAGES;
  const unsigned empty_k = full_v + 8 * STAGES, empty_v = empty_k + 8 * STAGES;
  const unsigned q_full = empty_v + 8 * STAGES, q_empty = q_full + 16;  // [2] each
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      // q_full: the producer's cp.async arrivals, plus thread 0's, which publishes the item.
      mbar_init(q_full + 8 * b, PRODUCER_THREADS + 1);
      mbar_init(q_empty + 8 * b, CONSUMER_WARPS);
    }
    for (int s = 0; s < STAGES; ++s) {
      // full: every producer thread's cp.async arrival, plus lane 0's arrival that announces
      // the TMA bytes (the phase also waits for those bytes).
      mbar_init(full_k + 8 * s, PRODUCER_THREADS + 1);
      mbar_init(full_v + 8 * s, PRODUCER_THREADS + 1);
      mbar_init(empty_k + 8 * s, CONSUMER_WARPS);
      mbar_init(empty_v + 8 * s, CONSUMER_WARPS);
    }
    fence_mbarrier_init();  // the inits, visible to the copy engine too
  }
  __syncthreads();

  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid / 32) % 4, lane = tid % 32;
  const int group = num_q_heads / num_kv_heads;
  struct Item { int kv_head, seq, row0, q_start, num_rows, kv_len, history, first_token, num_kv_tiles; };
  // Which item Q buffer b holds (idx >= num_items: none, the CTA is done), from the producer to
  // the consumers: written before the arrival that completes q_full[b], read after its wait.
  struct Slot { int idx; Item w; };
  static_assert(sizeof(Slot) <= 64, "a slot is WGMMA_SLOT_BYTES (_launch.py)");
  Slot* const slots = reinterpret_cast<Slot*>(smem_raw + (q_empty + 16 - smem_addr(smem_raw)));  // [2]
  const int num_work = num_items / num_kv_heads;
  auto item_of = [&](int idx) {
    Item w;
    // Head-major: the CTAs running at one time work on one or two KV heads, whose K/V then
    // stay in L2 for all of them; within a head, the plan's heaviest-first order.
    const int item = idx % num_work;
    w.kv_head = idx / num_work;
    w.seq = work[2 * item];
    w.row0 = work[2 * item + 1];
    w.q_start = cu_seqlens_q[w.seq];
    const int q_len = cu_seqlens_q[w.seq + 1] - w.q_start;
    w.kv_len = context_lens[w.seq];
    w.history = w.kv_len - q_len;
    w.num_rows = q_len * group;
    const int last_token = (min(w.row0 + BM, w.num_rows) - 1) / group;
    w.first_token = w.row0 / group;
    const int kv_end = causal ? w.history + last_token + 1 : w.kv_len;
    w.num_kv_tiles = (kv_end + BN - 1) / BN;
    return w;
  };

  if (wg == 0) {  // ---------------- the producer: copies only ----------------
    setmaxnreg_dec<PRODUCER_REGS>();
    const int block_shift = __ffs(block_size) - 1;  // block_size is a power of two (validated)
    const int box_rows = min(block_size, BN);
    int g0 = 0, n_item = 0;  // tiles of earlier items (the rings' running count), items done
    // NOTE: the consumers take their items from the slots in the same order, so both sides
    // agree on every stage and phase.
    for (;; ++n_item) {
      const int qb = n_item & 1;
      const unsigned q_s = q_s0 + qb * BM * D * 2;
      if (n_item >= 2) mbar_wait(q_empty + 8 * qb, ((n_item >> 1) - 1) & 1);  // buffer free again
      // The first item is blockIdx.x; the next ones come from a global counter, so a CTA that
      // finishes early takes more (the balance a static split would need a perfect order for).
      if (tid == 0)
        slots[qb].idx = n_item == 0 ? (int)blockIdx.x : (int)gridDim.x + atomicAdd(sched, 1);
      named_bar_sync(1, PRODUCER_THREADS);
      const int idx = slots[qb].idx;
      if (idx >= num_items) {  // none left: tell the consumers (the slot says so), then stop
        if (tid == 0) mbar_arrive(q_full + 8 * qb);
        mbar_arrive_cp_async(q_full + 8 * qb);
        break;
      }
      const Item w = item_of(idx);
      if (tid == 0) slots[qb].w = w;
      const int kv_head = w.kv_head, row0 = w.row0, num_rows = w.num_rows, q_start = w.q_start;
      const int kv_len = w.kv_len, num_kv_tiles = w.num_kv_tiles;
      const int* block_table = block_tables + (long long)w.seq * max_blocks_per_seq;
      // Q: rows past the sequence are zeros; buffer n_item % 2, free again once the consumers
      // released it two items ago.
      for (int c = tid; c < BM * CH; c += PRODUCER_THREADS) {
        const int r = c / CH, ch = c % CH;
        const int row = row0 + r;
        const T* src = query;
        int bytes = 0;
        if (row < num_rows) {
          const int token = q_start + row / group;
          const int head = kv_head * group + row % group;
          src = query + ((long long)token * num_q_heads + head) * D + ch * 8;
          bytes = 16;
        }
        cp_async_16(q_s + sw_off<BM>(r, ch), src, bytes);
      }
      if (tid == 0) mbar_arrive(q_full + 8 * qb);  // (a release: the slot is seen with Q)
      mbar_arrive_cp_async(q_full + 8 * qb);
      // A tile is cut into boxes of box_rows = min(block_size, BN) keys, each inside one page.
      // The page of box `tid` of `tile` (0 where there is none). It is read before put_k waits
      // for the tile's stage, so the block table's latency hides under that wait, and V of the
      // tile reuses it a step later. (Read after the wait: P1, P2 and P5 ran 1-5 % slower.)
      auto block_of = [&](int tile) -> int {
        const int pos = tile * BN + tid * box_rows;
        return (tid < BN / box_rows && pos < kv_len) ? block_table[pos >> block_shift] : 0;
      };
      auto put_tile = [&](const T* cache, const TmaDesc& map, unsigned dst, unsigned full, int tile,
                          int block) {
        const int pos0 = tile * BN;
        // Boxes wholly inside the context go by TMA (lane j of warp 0 asks for box j).
        const int num_boxes = max(0, min(BN / box_rows, (kv_len - pos0) / box_rows));
        if (tid == 0) mbar_arrive_expect_tx(full, (unsigned)(num_boxes * box_rows * D * 2));
        __syncwarp();
        if (tid < num_boxes) {
          const int pos = pos0 + tid * box_rows;
          const int cache_row = (block * num_kv_heads + kv_head) * block_size + (pos & (block_size - 1));
          // The box's whole rows in one request (at D = 64 the map is 2-D: a row is one block).
          if (D > 64)
            tma_load_4d(dst + tid * box_rows * D * 2, map, 0, 0, 0, cache_row / 8, full);
          else
            tma_load_2d(dst + tid * box_rows * 128, map, 0, cache_row, full);
        }
        // The rest (the context's last, partial page, and past it) by cp.async, zero-filled.
        const int first_row = num_boxes * box_rows;
        for (int c = tid; c < (BN - first_row) * CH; c += PRODUCER_THREADS) {
          const int r = first_row + c / CH, ch = c % CH;
          const int pos = pos0 + r;
          long long off = 0;
          int bytes = 0;
          if (pos < kv_len) {
            const long long block = block_table[pos >> block_shift];
            off = ((block * num_kv_heads + kv_head) * block_size + (pos & (block_size - 1))) * D + ch * 8;
            bytes = 16;
          }
          cp_async_16(dst + kv_off<D>(r, ch), cache + off, bytes);
        }
        mbar_arrive_cp_async(full);
      };
      // The k-th reuse of a stage waits for the k-th release of it (phase parity (k - 1) & 1).
      auto put_k = [&](int tile, int block) {
        const int g = g0 + tile, st = g % STAGES;
        if (g >= STAGES) mbar_wait(empty_k + 8 * st, ((g / STAGES) - 1) & 1);
        put_tile(key_cache, key_map, k_s0 + st * TILE_BYTES, full_k + 8 * st, tile, block);
      };
      auto put_v = [&](int tile, int block) {
        const int g = g0 + tile, st = g % STAGES;
        if (g >= STAGES) mbar_wait(empty_v + 8 * st, ((g / STAGES) - 1) & 1);
        put_tile(value_cache, value_map, v_s0 + st * TILE_BYTES, full_v + 8 * st, tile, block);
      };
      // In the order the consumers need them: iteration t reads K of t and V of t - 1.
      int block_cur = block_of(0);
      if (num_kv_tiles > 0) put_k(0, block_cur);
      for (int tile = 0; tile < num_kv_tiles; ++tile) {
        const int block_next = block_of(tile + 1);  // loads while put_k waits for its stage
        if (tile + 1 < num_kv_tiles) put_k(tile + 1, block_next);
        put_v(tile, block_cur);  // V of a tile: the pages K of it used
        block_cur = block_next;
      }
      g0 += num_kv_tiles;
    }
    cp_async_wait<0>();  // no copy may land in shared memory after the CTA has exited
    if (tid == 0) {
      // The last CTA to finish zeroes the counter for the next launch: every CTA's last
      // atomicAdd on sched[0] came before its own on sched[1].
      __threadfence();
      if (atomicAdd(sched + 1, 1) == (int)gridDim.x - 1) {
        __threadfence();  // the zeroing is ordered after the atomics that this one saw
        sched[0] = 0;
        sched[1] = 0;
      }
    }
    return;
  }

  // ---------------- the consumers: wgmma and the softmax ----------------
  setmaxnreg_inc<CONSUMER_REGS>();
  const int cwg = wg - 1;  // consumer index: rows 64 cwg .. 64 cwg + 63 of the tile
  int g0 = 0, n_item = 0;
  for (;; ++n_item) {
    const int qb = n_item & 1;
    mbar_wait(q_full + 8 * qb, (n_item >> 1) & 1);  // Q of this item landed, and its slot is set
    if (slots[qb].idx >= num_items) break;
    const Item w = slots[qb].w;
    const unsigned q_s = q_s0 + qb * BM * D * 2;
    const int kv_head = w.kv_head, row0 = w.row0, num_rows = w.num_rows, q_start = w.q_start;
    const int kv_len = w.kv_len, num_kv_tiles = w.num_kv_tiles, history = w.history;
    const int first_token = w.first_token;
    const int num_full_tiles = causal ? min(history + first_token + 1, kv_len) / BN : kv_len / BN;
    const int row_base = row0 + cwg * 64 + warp_in_wg * 16 + lane / 4;
    auto row_of = [&](int i) { return row_base + 8 * i; };
    auto q_pos_of = [&](int i) { return history + row_of(i) / group; };
    const bool has_alibi = alibi_slopes != nullptr;
    const float scale_log2 = scale * LOG2E;
    const float exp_scale = has_alibi ? 1.0f : scale_log2;

    float o[DT * 4];
#pragma unroll
    for (int k = 0; k < DT * 4; ++k) o[k] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    unsigned p[BN / 16][4];  // P of the previous tile: the A operand of its P V product

    const unsigned q_wg = q_s + cwg * 64 * 128;  // this consumer's 64 rows
    auto k_addr = [&](unsigned base, int kd) { return base + (kd / 4) * 1024u + (kd % 4) * 32; };
    auto q_addr = [&](int kd) { return q_wg + (kd / 4) * (unsigned)(BM * 128) + (kd % 4) * 32; };
    // Descriptors (PTX ISA, "matrix descriptor"; 128-byte swizzle). Q and K are K-major: a k16
    // step is 32 bytes inside a 128-byte row, 4 steps per 64-column block; the stride is the
    // distance between 8-row groups (Q: 1024 bytes, its column blocks hold BM rows; K: 16 * D,
    // kv_off's groups); the leading offset is unused. V is MN-major (N = head dim): 8-key groups
    // along K (stride, 16 * D) and 64-dim column blocks along N (leading, 1024 within a group).
    // NOTE: giving Q K's stride (or V's two offsets swapped) reads the wrong rows.
    constexpr unsigned SWZ = 1;  // 128-byte swizzle
    constexpr unsigned QK_LEAD = 16, Q_STRIDE = 1024, KV_STRIDE = 16 * D, V_LEAD = 1024;
    auto issue_pv = [&](int tile) {  // O += P V of `tile` (asynchronous: commit, wait later)
      const unsigned v_s = v_s0 + ((g0 + tile) % STAGES) * TILE_BYTES;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        // keys 16 kk ..: 8-row groups 2 kk and 2 kk + 1
        const unsigned v_addr = v_s + kk * (2 * KV_STRIDE);
        wgmma_rs_tb(WgmmaShape<D>(), o, p[kk], wgmma_desc(v_addr, V_LEAD, KV_STRIDE, SWZ), 1, T());
      }
      wgmma_commit();
    };

    for (int tile = 0; tile < num_kv_tiles; ++tile) {
      const int g = g0 + tile, st = g % STAGES;
      mbar_wait(full_k + 8 * st, (g / STAGES) & 1);  // K of this tile landed
      if (tile > 0) mbar_wait(full_v + 8 * ((g - 1) % STAGES), ((g - 1) / STAGES) & 1);
      fence_proxy_async();  // the producer's cp.async writes, now seen, also for the tensor cores

      // S = Q K^T: 64 rows x BN keys per consumer, D / 16 wgmma; then P V of the previous tile.
      float s[NT * 4];
#pragma unroll
      for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
      wgmma_fence();
      const unsigned k_s = k_s0 + st * TILE_BYTES;
#pragma unroll
      for (int kd = 0; kd < D / 16; ++kd) {
        wgmma_ss(WgmmaShape<BN>(), s, wgmma_desc(q_addr(kd), QK_LEAD, Q_STRIDE, SWZ),
                 wgmma_desc(k_addr(k_s, kd), QK_LEAD, KV_STRIDE, SWZ), kd > 0, T());
      }
      wgmma_commit();
      if (tile > 0) {
        issue_pv(tile - 1);
        wgmma_wait<1>();  // S is done; P V may still run
      } else {
        wgmma_wait<0>();
      }
      if (lane == 0) mbar_arrive(empty_k + 8 * st);  // this warp is done with K of this tile
      // NOTE: every item has a tile (kv_len >= q_len >= 1), so Q and its slot are released here.
      if (tile == num_kv_tiles - 1 && lane == 0) mbar_arrive(q_empty + 8 * qb);  // and with Q
#pragma unroll
      for (int k = 0; k < NT * 4; ++k) reg_fence(s[k]);

      const int kv0 = tile * BN;
      if (has_alibi) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float slope = alibi_slopes[kv_head * group + row_of(i) % group] * LOG2E;
          const int q_pos = q_pos_of(i);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * i; e < 2 * i + 2; ++e) {
              const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
              s[4 * nt + e] = s[4 * nt + e] * scale_log2 + slope * (float)(key - q_pos);
            }
        }
      }
      if (tile >= num_full_tiles) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int q_pos = q_pos_of(i);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * i; e < 2 * i + 2; ++e) {
              const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
              if (key >= kv_len || (causal && key > q_pos)) s[4 * nt + e] = -INFINITY;
            }
        }
      }

      // Online softmax per row; a row's BN columns live in the 4 lanes of a quad.
      float alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * i], s[4 * nt + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[i], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: exp2 stays 0
        alpha[i] = fast_exp2((m_run[i] - m_use) * exp_scale);
        m_run[i] = m_new;
        const float neg_m = -m_use * exp_scale;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          s[4 * nt + 2 * i] = fast_exp2(fmaf(s[4 * nt + 2 * i], exp_scale, neg_m));
          s[4 * nt + 2 * i + 1] = fast_exp2(fmaf(s[4 * nt + 2 * i + 1], exp_scale, neg_m));
          sum += s[4 * nt + 2 * i] + s[4 * nt + 2 * i + 1];
        }
        l_run[i] = l_run[i] * alpha[i] + sum;
      }
      wgmma_wait<0>();  // P V of the previous tile is in O, and its P registers are free
      if (tile > 0 && lane == 0) mbar_arrive(empty_v + 8 * ((g - 1) % STAGES));  // V released
#pragma unroll
      for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[4 * dt + 0] *= alpha[0];
        o[4 * dt + 1] *= alpha[0];
        o[4 * dt + 2] *= alpha[1];
        o[4 * dt + 3] *= alpha[1];
      }
      // P: the S accumulators are already the A fragments of the next wgmma, 16 keys each.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        p[kk][0] = MmaType<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = MmaType<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = MmaType<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = MmaType<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
      }
    }
    if (num_kv_tiles > 0) {  // the last tile's P V
      const int last = num_kv_tiles - 1, gl = g0 + last;
      mbar_wait(full_v + 8 * (gl % STAGES), (gl / STAGES) & 1);
      fence_proxy_async();
#pragma unroll
      for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
      wgmma_fence();
      issue_pv(last);
      wgmma_wait<0>();
      if (lane == 0) mbar_arrive(empty_v + 8 * (gl % STAGES));
#pragma unroll
      for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
    }

    // ---- O / l -> out ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_run[i];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row_of(i);
      if (row >= num_rows) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int token = q_start + row / group;
      const int head = kv_head * group + row % group;
      T* dst = out + ((long long)token * num_q_heads + head) * D + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        *reinterpret_cast<unsigned*>(dst + dt * 8) =
            MmaType<T>::pack(o[4 * dt + 2 * i] * inv, o[4 * dt + 2 * i + 1] * inv);
      }
    }
    g0 += num_kv_tiles;
  }
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
