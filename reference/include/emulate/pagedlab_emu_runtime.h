// pagedlab_emu_runtime.h — the engine of the emulated device (see pagedlab_emu.h for the design).
// Compiled once, at -O2, into the object that every emulated kernel library links (emulate.py);
// kernel files never include it.
#pragma once

#include "pagedlab_emu.h"

#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ----------------------------------------------------------------------------- the engine

namespace pagedlab_emu {

// AT_MBAR: parked in mbar_wait until the barrier's phase of that parity completes; AT_NAMED: at a
// named barrier (bar.sync id, count) until `count` threads have arrived (Hopper, Lab 5.6).
enum State { RUNNABLE = 0, AT_BARRIER = 1, AT_WARP_OP = 2, DONE = 3, AT_MBAR = 4, AT_NAMED = 5 };

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;
  int group;  // index of the commit group this copy belongs to
  unsigned epoch;  // racecheck: the barrier epoch it was issued in (in flight from then on)
  unsigned sync;  // racecheck: the issuing warp's __syncwarp count at the issue
  const void* pc;  // racecheck: where it was issued
};

struct Fiber {
  void* sp = nullptr;  // saved stack pointer (x86-64 switch)
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  unsigned char* stack = nullptr;  // lowest usable byte (a guard page lies below it)
  size_t stack_bytes = 0;
  uint3 tid{0, 0, 0};
  int linear = 0, warp = 0, lane = 0;
  State state = RUNNABLE;
  const char* wait_file = nullptr;  // where it waits (barrier or warp collective)
  int wait_line = 0;
  const char* wait_what = nullptr;
  std::vector<PendingCopy> copies;
  int committed = 0;  // cp.async groups committed so far
  unsigned mbar_addr = 0, mbar_parity = 0;  // AT_MBAR: the barrier and the parity awaited
  int named_id = 0;                          // AT_NAMED: the barrier number
};

// An mbarrier (Hopper): the 8 bytes in shared memory are the kernel's, the state lives here
// (keyed by shared address, reset for every block). A phase completes when `pending` arrivals
// and the transaction bytes `tx` are both down to zero; `phase` counts completed phases.
struct Mbar {
  unsigned addr = 0;
  int count = 0, pending = 0;
  long long tx = 0;
  unsigned phase = 0;
  int init_line = 0;
  std::vector<PendingCopy> copies;  // cp.async copies an mbar_arrive_cp_async handed over
};
// What mbar_init writes into the barrier's 8 bytes: a store, cp.async or TMA box that lands on
// a live barrier changes them, and the next arrive or wait says so.
constexpr unsigned long long MBAR_COOKIE = 0x4d4241524c50ull;  // "PLRABM\0\0"

// A TMA box copy in flight: it lands (and counts its bytes on its mbarrier) when a thread waits
// on that barrier, or when nothing else can run.
struct TmaCopy {
  unsigned dst = 0, mbar = 0;
  unsigned long long words[16];
  int coords[5];
  int rank = 0;
  unsigned char* base = nullptr;  // the tensor's first byte in its fenced region
  unsigned long long bytes = 0;   // the box's
};
// A warpgroup's wgmma in the making: each of its 128 threads deposits its operands and parks;
// the last to arrive computes D for all of them (warpgroup lockstep, like a warp collective).
struct WgmmaLane {
  float* d = nullptr;
  unsigned a[4];
  unsigned long long a_desc = 0, b_desc = 0;
  int n = 0, scale_d = 0, line = 0;
  bool bf16 = false, a_regs = false, b_mn_major = false;
};
struct WarpGroupOp {
  int arrived = 0;
  WgmmaLane lane[128];
};

struct Warp {
  unsigned exists = 0;   // lanes that are threads of the block
  unsigned arrived = 0;  // lanes parked at a collective
  unsigned mask[32];
  unsigned in[32][12];
  unsigned out[32][4];
  const char* what[32];
  int line[32];
  unsigned sync = 0;  // racecheck: collectives completed (each orders the lanes of its mask)
};


struct Region {  // a fenced copy of one argument buffer
  unsigned char* map = nullptr;
  size_t map_bytes = 0;
  unsigned char* data = nullptr;  // the array's first byte
  size_t nbytes = 0;
  int elem_size = 1;
  bool is_const = false;
  const char* name = "";
  unsigned long long host_addr = 0;  // the caller's array (TMA maps name it by this address)
  // Lazy regions (arrays of LAZY_BYTES or more): no copy up front; a page of the array is
  // copied in from the caller's memory at the first access that touches it (the trap handler
  // does it and resumes the access), and only touched pages are copied back. The end fence
  // stays exact, and a 9 GiB cache costs the pages a kernel reads, not 9 GiB.
  bool lazy = false;
  const unsigned char* host = nullptr;
  unsigned char* pages_lo = nullptr;  // first data page (page-aligned)
  std::vector<unsigned char> touched;  // per data page: copied in
};

struct Launch {
  const char* kernel = "";
  Trampoline tramp = nullptr;
  void** args = nullptr;
  dim3 grid, block;
  uint3 bid{0, 0, 0};
  int num_threads = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  void* sched_sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t sched_uc;
#endif
  int n_runnable = 0, n_barrier = 0, n_warp = 0, n_done = 0;
  unsigned char* arena = nullptr;  // shared memory: dynamic part first, then static arrays
  size_t arena_cap = 0, dyn_bytes = 0, arena_used = 0, poisoned = 0;
  size_t guard_end = 0;  // canary bytes [arena_used, guard_end) this block (see run_block)
  std::vector<std::pair<long long, size_t>> static_slots;  // (id << 32 | size) -> offset
  std::vector<const char*> slot_names;  // the __shared__ array of each static slot
  std::vector<Region> regions;
  std::vector<Mbar> mbars;                 // Hopper: this block's mbarriers
  std::vector<TmaCopy> tma;                // Hopper: TMA copies not landed yet
  int named_waiting[16] = {0}, named_count[16] = {0};  // Hopper: bar.sync id, count
  std::vector<WarpGroupOp> wgops;          // Hopper: per warpgroup
  int n_mbar = 0, n_named = 0;
  sigjmp_buf jmp;
  std::string error;
  bool running = false;
};

PL_HIDDEN inline Launch*& launch_ref() { static thread_local Launch* l = nullptr; return l; }
PL_HIDDEN inline Fiber*& current_ref() { static thread_local Fiber* f = nullptr; return f; }
inline Launch& L() { return *launch_ref(); }
inline Fiber& cur() { return *current_ref(); }

std::string where(const Fiber& f);
[[noreturn]] void fail(const std::string& msg);

// ----------------------------------------------------------------------------- racecheck state
// The emulated racecheck (compute-sanitizer racecheck's counterpart). Kernel libraries built
// for it are compiled with g++ -fsanitize=thread, which makes every load and store the kernel
// code does call __tsan_readN / __tsan_writeN (defined below, not libtsan's): the hooks look at
// accesses to the block's shared memory only. Happens-before is tracked with epochs, not with
// the scheduler's actual order (which is one of many the GPU could pick):
//   * a block epoch, advanced when a __syncthreads releases (and when a new block starts);
//   * per warp, a count of completed __syncwarp()s: two lanes of one warp are ordered when one
//     lies between their accesses (shuffles and other collectives exchange registers only);
//   * a cp.async write is in flight from its issue until the wait_group that lands it: any
//     other thread's access to its bytes in between is a hazard.
// Per shared byte the shadow keeps the last write and up to two reads of the current epoch;
// an access conflicts with one of another thread that no barrier or collective orders, when at
// least one of the two writes. Hazards are counted per (kind, site pair); the first example of
// each is kept for the report.
struct RaceCell {
  unsigned w_epoch = 0, w_sync = 0;
  int w_tid = -1;
  const void* w_pc = nullptr;
  unsigned r_epoch = 0;
  unsigned r_sync[2] = {0, 0};
  int r_tid[2] = {-1, -1};
  const void* r_pc[2] = {nullptr, nullptr};
};
struct Hazard {
  char kind[4];  // "RAW", "WAR", "WAW"
  const void* pc_first;
  const void* pc_second;
  int tid_first, tid_second;
  uint3 bid;
  size_t offset;  // byte in the shared arena
  long long count;
};
struct RaceState {
  bool on = false;  // set by pagedlab_emu_set_racecheck (emulate.py)
  unsigned char* base = nullptr;  // the arena of the running launch (null: hooks do nothing)
  size_t cap = 0;
  unsigned epoch = 1;
  std::vector<RaceCell> cells;
  std::vector<Hazard> hazards;
  long long total = 0;
  std::string report;
};
PL_HIDDEN inline RaceState& race() { static RaceState r; return r; }
void yield_to_scheduler();

}  // namespace pagedlab_emu


// ----------------------------------------------------------------------------- context switch

#if defined(__x86_64__)
// pl_emu_switch(save, next): push the callee-saved registers, store the stack pointer in *save,
// load `next`, pop its registers, return into it. pl_emu_entry starts a fresh fiber: its
// Fiber* arrives in r12 (popped from the prepared stack).
extern "C" PL_HIDDEN void pl_emu_switch(void** save, void* next);
extern "C" PL_HIDDEN void pl_emu_entry();
extern "C" PL_HIDDEN void pl_emu_fiber_main(pagedlab_emu::Fiber* f);
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl pl_emu_switch\n"
    ".hidden pl_emu_switch\n"
    ".type pl_emu_switch,@function\n"
    "pl_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size pl_emu_switch, .-pl_emu_switch\n"
    ".p2align 4\n"
    ".globl pl_emu_entry\n"
    ".hidden pl_emu_entry\n"
    ".type pl_emu_entry,@function\n"
    "pl_emu_entry:\n"
    "  movq %r12, %rdi\n"
    "  call pl_emu_fiber_main\n"
    "  ud2\n"
    ".size pl_emu_entry, .-pl_emu_entry\n");
#else
extern "C" PL_HIDDEN void pl_emu_fiber_main(pagedlab_emu::Fiber* f);
#endif

namespace pagedlab_emu {

#if !defined(__x86_64__)
inline void pl_emu_fiber_trampoline_c() { pl_emu_fiber_main(&cur()); }
#endif

inline void prepare_fiber(Fiber& f) {
#if defined(__x86_64__)
  // Stack, top down: [entry][rbp][rbx][r12 = &f][r13][r14][r15] <- sp. After the pops and the
  // ret, rsp = top - 16 (16-byte aligned), so pl_emu_entry's call enters with the ABI's rsp.
  uintptr_t top = (uintptr_t)(f.stack + f.stack_bytes) & ~uintptr_t(15);
  void** sp = (void**)(top - 72);
  sp[0] = nullptr; sp[1] = nullptr; sp[2] = nullptr; sp[3] = &f;
  sp[4] = nullptr; sp[5] = nullptr; sp[6] = (void*)&pl_emu_entry;
  f.sp = sp;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = f.stack_bytes;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, (void (*)())pl_emu_fiber_trampoline_c, 0);
#endif
}

inline void switch_to(Fiber& f) {
  current_ref() = &f;
#if defined(__x86_64__)
  pl_emu_switch(&L().sched_sp, f.sp);
#else
  swapcontext(&L().sched_uc, &f.uc);
#endif
}

inline void yield_to_scheduler() {
  Fiber& f = cur();
#if defined(__x86_64__)
  pl_emu_switch(&f.sp, L().sched_sp);
#else
  swapcontext(&f.uc, &L().sched_uc);
#endif
}

inline void set_state(Fiber& f, State s) {
  Launch& l = L();
  int* counts[6] = {&l.n_runnable, &l.n_barrier, &l.n_warp, &l.n_done, &l.n_mbar, &l.n_named};
  --*counts[f.state];
  ++*counts[s];
  f.state = s;
}

// "threads 0..31, 64" style lists.
inline std::string thread_list(const std::vector<int>& ids, size_t limit = 12) {
  std::string s;
  size_t shown = 0;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (shown++ == limit) { s += ", ..."; break; }
    if (!s.empty()) s += ", ";
    s += std::to_string(ids[i]);
    if (j > i) s += ".." + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

inline std::string where(const Fiber& f) {
  const Launch& l = L();
  char buf[160];
  std::snprintf(buf, sizeof buf, "block (%u, %u, %u), thread (%u, %u, %u)", l.bid.x, l.bid.y,
                l.bid.z, f.tid.x, f.tid.y, f.tid.z);
  return buf;
}

[[noreturn]] inline void fail(const std::string& msg) {
  Launch& l = L();
  l.error = msg;
  siglongjmp(l.jmp, 2);
}

inline std::string short_file(const char* file) {
  std::string s = file ? file : "?";
  const size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

// ----------------------------------------------------------------------------- barriers

void syncthreads(const char* file, int line) {
  Fiber& f = cur();
  f.wait_file = file;
  f.wait_line = line;
  f.wait_what = "__syncthreads()";
  set_state(f, AT_BARRIER);
  yield_to_scheduler();
}

void land_all_tma(Launch& l);                            // Hopper (below)
[[noreturn]] void hopper_deadlock(Launch& l, const char* head);
void wgmma_deadlock(Launch& l, const char* head);

// Called by the scheduler when no fiber can run: release the barrier or explain the deadlock.
inline void resolve_block(Launch& l) {
  std::string kernel = l.kernel;
  char head[200];
  std::snprintf(head, sizeof head, "kernel %s, block (%u, %u, %u): ", l.kernel, l.bid.x, l.bid.y,
                l.bid.z);
  // TMA copies land when nothing else can run (or when their barrier is waited on): landing
  // them may complete a phase and wake its waiters.
  if (!l.tma.empty()) {
    land_all_tma(l);
    if (l.n_runnable > 0) return;
  }
  if (l.n_warp == 0 && (l.n_mbar > 0 || l.n_named > 0)) hopper_deadlock(l, head);
  if (l.n_barrier > 0 && l.n_warp == 0) {
    // Every thread that is not finished waits at a __syncthreads: the same one?
    const Fiber* first = nullptr;
    std::vector<int> at_first, elsewhere, exited;
    std::string other;
    for (const Fiber& f : l.fibers) {
      if (f.state == DONE) { exited.push_back(f.linear); continue; }
      if (!first) first = &f;
      if (f.wait_line == first->wait_line && std::strcmp(f.wait_file, first->wait_file) == 0) {
        at_first.push_back(f.linear);
      } else {
        elsewhere.push_back(f.linear);
        if (other.empty())
          other = short_file(f.wait_file) + ":" + std::to_string(f.wait_line);
      }
    }
    const std::string site = short_file(first->wait_file) + ":" + std::to_string(first->wait_line);
    if (!exited.empty()) {
      fail(head + std::string("deadlock: __syncthreads() at ") + site + " waits for threads " +
           thread_list(exited) + ", which exited without reaching it (threads " +
           thread_list(at_first) + " wait there). A barrier inside a branch that not every "
           "thread of the block takes hangs or misbehaves on the GPU.");
    }
    if (!elsewhere.empty()) {
      fail(head + std::string("deadlock: threads ") + thread_list(at_first) +
           " wait at __syncthreads() at " + site + " but threads " + thread_list(elsewhere) +
           " wait at another one (" + other + "). Every thread of a block must reach the same "
           "barrier: a __syncthreads() inside a divergent branch is a bug.");
    }
    ++race().epoch;  // accesses after this barrier are ordered after every one before it
    for (Fiber& f : l.fibers)
      if (f.state == AT_BARRIER) set_state(f, RUNNABLE);
    return;
  }
  // Some warp collective cannot complete: name a waiting lane and the lanes it waits for.
  for (size_t w = 0; w < l.warps.size(); ++w) {
    Warp& wp = l.warps[w];
    if (!wp.arrived) continue;
    const int lane = __builtin_ctz(wp.arrived);
    const unsigned need = wp.mask[lane] & wp.exists;
    std::vector<int> missing, waiting;
    std::string why;
    for (int i = 0; i < 32; ++i) {
      if (!((need >> i) & 1u)) continue;
      const Fiber& f = l.fibers[w * 32 + i];
      if ((wp.arrived >> i) & 1u) { waiting.push_back(f.linear); continue; }
      missing.push_back(f.linear);
      if (why.empty()) {
        why = f.state == DONE ? "exited"
                              : std::string("wait at ") + (f.wait_what ? f.wait_what : "?") +
                                    " at " + short_file(f.wait_file) + ":" +
                                    std::to_string(f.wait_line);
      }
    }
    fail(head + std::string("deadlock: threads ") + thread_list(waiting) + " wait in " +
         wp.what[lane] + " at line " + std::to_string(wp.line[lane]) + " for threads " +
         thread_list(missing) + " of their mask, which never arrive (the first " + why +
         "). Every lane named in a *_sync mask must execute the same collective.");
  }
  wgmma_deadlock(l, head);
  fail(std::string(head) + "internal error: no runnable thread and nothing to release");
}

// A warp collective: this lane deposits NIN words, parks, and gets NOUT words back. The last
// lane of the mask to arrive runs `combine` for all of them (warp lockstep at collectives).
typedef void (*Combine)(Warp& w, unsigned lanes);
inline void combine_nothing(Warp&, unsigned);  // __syncwarp's (defined below)

inline void warp_collective(unsigned mask, const unsigned* in, int nin, unsigned* out, int nout,
                            const char* what, int line, Combine combine) {
  Fiber& f = cur();
  Launch& l = L();
  Warp& w = l.warps[f.warp];
  if (!((mask >> f.lane) & 1u)) {
    fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": " + what + " at line " +
         std::to_string(line) + " with a mask (0x" + [&] {
           char b[16]; std::snprintf(b, sizeof b, "%08x", mask); return std::string(b); }() +
         ") that does not include the calling lane " + std::to_string(f.lane));
  }
  std::memcpy(w.in[f.lane], in, sizeof(unsigned) * nin);
  w.mask[f.lane] = mask;
  w.what[f.lane] = what;
  w.line[f.lane] = line;
  w.arrived |= 1u << f.lane;
  const unsigned need = mask & w.exists;
  if ((w.arrived & need) != need) {
    f.wait_what = what;
    f.wait_file = "";
    f.wait_line = line;
    set_state(f, AT_WARP_OP);
    yield_to_scheduler();
  } else {
    for (int i = 0; i < 32; ++i) {
      if (((need >> i) & 1u) && (w.mask[i] != mask || std::strcmp(w.what[i], what) != 0)) {
        fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": lanes of warp " +
             std::to_string(f.warp) + " meet at different collectives: " + w.what[i] +
             " (line " + std::to_string(w.line[i]) + ", lane " + std::to_string(i) + ") and " +
             what + " (line " + std::to_string(line) + ", lane " + std::to_string(f.lane) +
             "), or with different masks");
      }
    }
    combine(w, need);
    // racecheck: __syncwarp orders the memory accesses of its lanes. NOTE: shuffles, votes,
    // mma and ldmatrix exchange registers only; they order no memory (compute-sanitizer's
    // racecheck, too, reports lanes that share memory across a bare __shfl_sync).
    if (combine == combine_nothing) ++w.sync;
    w.arrived &= ~need;
    for (int i = 0; i < 32; ++i) {
      if (((need >> i) & 1u) && i != f.lane) {
        Fiber& other = l.fibers[f.warp * 32 + i];
        if (other.state == AT_WARP_OP) set_state(other, RUNNABLE);
      }
    }
  }
  std::memcpy(out, w.out[f.lane], sizeof(unsigned) * nout);
}

// Shuffles: in = {value lo, value hi, source lane}.
inline void combine_shfl(Warp& w, unsigned lanes) {
  for (int i = 0; i < 32; ++i) {
    if (!((lanes >> i) & 1u)) continue;
    const unsigned src = w.in[i][2];
    const int from = (src < 32 && ((lanes >> src) & 1u)) ? int(src) : i;
    w.out[i][0] = w.in[from][0];
    w.out[i][1] = w.in[from][1];
  }
}
inline void combine_ballot(Warp& w, unsigned lanes) {
  unsigned bits = 0;
  for (int i = 0; i < 32; ++i)
    if (((lanes >> i) & 1u) && w.in[i][0]) bits |= 1u << i;
  for (int i = 0; i < 32; ++i)
    if ((lanes >> i) & 1u) w.out[i][0] = bits;
}
inline void combine_nothing(Warp&, unsigned) {}

unsigned long long shfl_bits(unsigned mask, unsigned long long bits, int src, const char* what,
                             int line) {
  unsigned in[3] = {unsigned(bits), unsigned(bits >> 32), (unsigned)src}, out[2];
  warp_collective(mask, in, 3, out, 2, what, line, combine_shfl);
  return (unsigned long long)out[1] << 32 | out[0];
}
unsigned ballot_sync(int line, unsigned mask, int pred, const char* what) {
  unsigned in[1] = {pred ? 1u : 0u}, out[1];
  warp_collective(mask, in, 1, out, 1, what, line, combine_ballot);
  return out[0];
}
void syncwarp(int line, unsigned mask) {
  unsigned in[1] = {0}, out[1];
  warp_collective(mask, in, 1, out, 1, "__syncwarp", line, combine_nothing);
}
const uint3& thread_idx() { return cur().tid; }
const uint3& block_idx() { return L().bid; }
const dim3& block_dim() { return L().block; }
const dim3& grid_dim() { return L().grid; }
int lane_id() { return cur().lane; }

// ----------------------------------------------------------------------------- shared memory

unsigned char* dynamic_shared() { return L().arena; }

// Static __shared__ declaration number `id` of `size` bytes: one slot per launch, the same
// storage for every thread of a block (and poisoned again for the next block).
void* static_shared(int id, size_t size, size_t align, const char* name) {
  Launch& l = L();
  const long long key = (long long)id << 32 | (long long)size;
  for (auto& s : l.static_slots)
    if (s.first == key) return l.arena + s.second;
  size_t off = (l.arena_used + align - 1) / align * align;
  if (off + size > l.arena_cap) {
    fail(std::string("kernel ") + l.kernel + ": shared memory exceeds the emulated device's " +
         std::to_string(l.arena_cap) + " bytes per block (dynamic " +
         std::to_string(l.dyn_bytes) + " + static arrays)");
  }
  l.static_slots.push_back({key, off});
  l.slot_names.push_back(name);
  l.arena_used = off + size;  // NOTE: the canary now starts past this slot (check_shared_guard)
  if (l.arena_used > l.poisoned) {
    std::memset(l.arena + l.poisoned, 0xff, l.arena_used - l.poisoned);
    l.poisoned = l.arena_used;
  }
  return l.arena + off;
}

unsigned shared_offset(const void* p, const char* what) {
  Launch& l = L();
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c < l.arena || c >= l.arena + l.arena_cap) {
    fail(std::string("kernel ") + l.kernel + ", " + where(cur()) + ": " + what +
         " of a pointer that is not in shared memory");
  }
  return unsigned(c - l.arena);
}
inline unsigned char* shared_at(unsigned addr, size_t bytes, const char* what) {
  Launch& l = L();
  if (size_t(addr) + bytes > l.arena_cap) {
    fail(std::string("kernel ") + l.kernel + ", " + where(cur()) + ": " + what +
         " at shared address " + std::to_string(addr) + " is outside shared memory");
  }
  return l.arena + addr;
}

// ----------------------------------------------------------------------------- racecheck

constexpr size_t MAX_HAZARD_SITES = 64;

inline void race_hazard(const char* kind, const void* pc_first, int tid_first,
                        const void* pc_second, int tid_second, size_t offset) {
  RaceState& r = race();
  ++r.total;
  for (Hazard& h : r.hazards) {
    if (h.pc_first == pc_first && h.pc_second == pc_second && std::strcmp(h.kind, kind) == 0) {
      ++h.count;
      return;
    }
  }
  if (r.hazards.size() >= MAX_HAZARD_SITES) return;
  Hazard h{};
  std::snprintf(h.kind, sizeof h.kind, "%s", kind);
  h.pc_first = pc_first;
  h.pc_second = pc_second;
  h.tid_first = tid_first;
  h.tid_second = tid_second;
  h.bid = L().bid;
  h.offset = offset;
  h.count = 1;
  r.hazards.push_back(h);
}

// Whether an access of thread `tid` recorded in (epoch, sync) is unordered with the access of
// the running thread `f` now: the same block epoch, another thread, and (same warp) no
// collective in between.
inline bool race_unordered(const RaceState& r, const Fiber& f, unsigned wsync, int tid,
                           unsigned epoch, unsigned sync) {
  if (tid < 0 || tid == f.linear || epoch != r.epoch) return false;
  return !(tid / 32 == f.warp && sync != wsync);
}

// One access of `n` bytes at `p` (already known to be shared memory) by the running thread.
inline void race_access(const unsigned char* p, size_t n, bool write, const void* pc,
                        unsigned wsync) {
  RaceState& r = race();
  const Fiber& f = cur();
  const size_t first = size_t(p - r.base);
  for (size_t off = first; off < first + n && off < r.cap; ++off) {
    RaceCell& c = r.cells[off];
    if (race_unordered(r, f, wsync, c.w_tid, c.w_epoch, c.w_sync)) {
      race_hazard(write ? "WAW" : "RAW", c.w_pc, c.w_tid, pc, f.linear, off);
    }
    if (write) {
      for (int k = 0; k < 2; ++k) {
        if (race_unordered(r, f, wsync, c.r_tid[k], c.r_epoch, c.r_sync[k]))
          race_hazard("WAR", c.r_pc[k], c.r_tid[k], pc, f.linear, off);
      }
      c.w_epoch = r.epoch;
      c.w_sync = wsync;
      c.w_tid = f.linear;
      c.w_pc = pc;
      c.r_tid[0] = c.r_tid[1] = -1;  // reads before this write are settled (reported above)
    } else {
      if (c.r_epoch != r.epoch) {
        c.r_epoch = r.epoch;
        c.r_tid[0] = c.r_tid[1] = -1;
      }
      // Keep the first reader and the latest other one: enough to know whether a later
      // writer conflicts with some other thread's read.
      const int k = (c.r_tid[0] < 0 || c.r_tid[0] == f.linear) ? 0 : 1;
      c.r_tid[k] = f.linear;
      c.r_sync[k] = wsync;
      c.r_pc[k] = pc;
    }
  }
}

inline void race_hook(const void* addr, size_t n, bool write, const void* pc) {
  RaceState& r = race();
  const uintptr_t off = uintptr_t(addr) - uintptr_t(r.base);
  if (off >= r.cap) return;  // not shared memory (or racecheck off: cap is 0)
  Fiber* f = current_ref();
  if (!f) return;
  race_access(static_cast<const unsigned char*>(addr), n, write, pc, L().warps[f->warp].sync);
}

// Whether an access of thread `tid` recorded in (epoch, sync) may overlap cp.async copy `c`,
// in flight from its issue to its landing: another thread, and not ordered before the issue.
// An access of an earlier block epoch is ordered before it by that __syncthreads. NOTE: one of
// the issuing warp's lanes is also ordered before it by a __syncwarp between the two (its sync
// count is then below the issue's), which is how v6 refills the ring slot its lanes just read.
inline bool race_in_flight(const PendingCopy& c, const Fiber& f, int tid, unsigned epoch,
                           unsigned sync) {
  if (tid < 0 || tid == f.linear || epoch < c.epoch) return false;
  return !(epoch == c.epoch && tid / 32 == f.warp && sync < c.sync);
}

// A cp.async copy landing: its bytes were written at some time from its issue to now, so any
// other thread's access to them since the issue (race_in_flight) is a hazard.
inline void race_async_landing(const PendingCopy& c, const Fiber& f) {
  RaceState& r = race();
  if (!r.base) return;
  const size_t first = size_t(c.dst - r.base);
  for (size_t off = first; off < first + 16 && off < r.cap; ++off) {
    RaceCell& cell = r.cells[off];
    if (race_in_flight(c, f, cell.w_tid, cell.w_epoch, cell.w_sync))
      race_hazard("WAW", cell.w_pc, cell.w_tid, c.pc, f.linear, off);
    for (int k = 0; k < 2; ++k) {
      if (race_in_flight(c, f, cell.r_tid[k], cell.r_epoch, cell.r_sync[k]))
        race_hazard("WAR", cell.r_pc[k], cell.r_tid[k], c.pc, f.linear, off);
    }
  }
  race_access(c.dst, 16, true, c.pc, L().warps[f.warp].sync);
}

// The __shared__ array holding arena byte `off` ("name[+byte]").
inline std::string shared_name(size_t off) {
  const Launch& l = L();
  for (size_t i = 0; i < l.static_slots.size(); ++i) {
    const size_t start = l.static_slots[i].second;
    const size_t size = size_t(l.static_slots[i].first & 0xffffffffLL);
    if (off >= start && off < start + size) {
      const char* name = l.slot_names[i] && *l.slot_names[i] ? l.slot_names[i] : "__shared__";
      return std::string(name) + "+" + std::to_string(off - start);
    }
  }
  if (off < l.dyn_bytes) return "extern __shared__ (dynamic)+" + std::to_string(off);
  return "shared+" + std::to_string(off);
}

inline std::string pc_text(const void* pc) {
  Dl_info info{};
  if (pc && dladdr(pc, &info) && info.dli_fbase) {
    char b[40];
    // Return addresses point after the call: one byte back lies inside the access's line.
    std::snprintf(b, sizeof b, "@pc:%lx@", (unsigned long)(uintptr_t(pc) - uintptr_t(info.dli_fbase) - 1));
    return b;
  }
  return "?";
}

inline std::string tid_text(int linear) {
  const dim3& b = L().block;
  char s[64];
  std::snprintf(s, sizeof s, "(%u, %u, %u)", unsigned(linear) % b.x, (unsigned(linear) / b.x) % b.y,
                unsigned(linear) / (b.x * b.y));
  return s;
}

// One line per hazard site: kind, count, array+offset, block, first (thread, site), second.
inline void race_finish_launch() {
  RaceState& r = race();
  std::string out;
  for (const Hazard& h : r.hazards) {
    char blk[64];
    std::snprintf(blk, sizeof blk, "(%u, %u, %u)", h.bid.x, h.bid.y, h.bid.z);
    out += std::string(h.kind) + "\t" + std::to_string(h.count) + "\t" + shared_name(h.offset) +
           "\t" + blk + "\t" + tid_text(h.tid_first) + "\t" + pc_text(h.pc_first) + "\t" +
           tid_text(h.tid_second) + "\t" + pc_text(h.pc_second) + "\n";
  }
  r.report = out;
  r.hazards.clear();
  r.base = nullptr;
  r.cap = 0;
}

}  // namespace pagedlab_emu

// The hooks g++ -fsanitize=thread calls (only kernel libraries built for racecheck call them).
#define PL_TSAN_RW(N)                                                                        \
  extern "C" PL_HIDDEN void __tsan_read##N(void* p) {                                        \
    pagedlab_emu::race_hook(p, N, false, __builtin_return_address(0));                        \
  }                                                                                          \
  extern "C" PL_HIDDEN void __tsan_write##N(void* p) {                                       \
    pagedlab_emu::race_hook(p, N, true, __builtin_return_address(0));                         \
  }                                                                                          \
  extern "C" PL_HIDDEN void __tsan_unaligned_read##N(void* p) {                              \
    pagedlab_emu::race_hook(p, N, false, __builtin_return_address(0));                        \
  }                                                                                          \
  extern "C" PL_HIDDEN void __tsan_unaligned_write##N(void* p) {                             \
    pagedlab_emu::race_hook(p, N, true, __builtin_return_address(0));                         \
  }                                                                                          \
  extern "C" PL_HIDDEN void __tsan_volatile_read##N(void* p) {                               \
    pagedlab_emu::race_hook(p, N, false, __builtin_return_address(0));                        \
  }                                                                                          \
  extern "C" PL_HIDDEN void __tsan_volatile_write##N(void* p) {                              \
    pagedlab_emu::race_hook(p, N, true, __builtin_return_address(0));                         \
  }
PL_TSAN_RW(1)
PL_TSAN_RW(2)
PL_TSAN_RW(4)
PL_TSAN_RW(8)
PL_TSAN_RW(16)
#undef PL_TSAN_RW
extern "C" PL_HIDDEN void __tsan_read_range(void* p, unsigned long n) {
  pagedlab_emu::race_hook(p, n, false, __builtin_return_address(0));
}
extern "C" PL_HIDDEN void __tsan_write_range(void* p, unsigned long n) {
  pagedlab_emu::race_hook(p, n, true, __builtin_return_address(0));
}
extern "C" PL_HIDDEN void __tsan_init() {}
extern "C" PL_HIDDEN void __tsan_func_entry(void*) {}
extern "C" PL_HIDDEN void __tsan_func_exit() {}
extern "C" PL_HIDDEN void __tsan_vptr_update(void**, void*) {}
extern "C" PL_HIDDEN void __tsan_vptr_read(void**) {}
// Atomics: never a hazard (racecheck, too, orders them); performed as the plain builtins.
#define PL_TSAN_ATOMIC(N, T)                                                                  \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_load(const volatile T* a, int) {                   \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                              \
  }                                                                                           \
  extern "C" PL_HIDDEN void __tsan_atomic##N##_store(volatile T* a, T v, int) {                \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {               \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {               \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {               \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {               \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {              \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                           \
  extern "C" PL_HIDDEN int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, \
                                                                      int, int) {             \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
  }                                                                                           \
  extern "C" PL_HIDDEN int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v,   \
                                                                    int, int) {               \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);    \
  }                                                                                           \
  extern "C" PL_HIDDEN T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, \
                                                                 int) {                       \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);         \
    return c;                                                                                 \
  }
PL_TSAN_ATOMIC(8, unsigned char)
PL_TSAN_ATOMIC(16, unsigned short)
PL_TSAN_ATOMIC(32, unsigned)
PL_TSAN_ATOMIC(64, unsigned long long)
#undef PL_TSAN_ATOMIC
extern "C" PL_HIDDEN void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" PL_HIDDEN void __tsan_atomic_signal_fence(int) {}

namespace pagedlab_emu {

// ----------------------------------------------------------------------------- PTX emulation

inline float lo_half(unsigned w, bool bf16) {
  const unsigned short b = (unsigned short)(w & 0xffffu);
  return bf16 ? bf16_bits_to_float(b) : half_bits_to_float(b);
}
inline float hi_half(unsigned w, bool bf16) {
  const unsigned short b = (unsigned short)(w >> 16);
  return bf16 ? bf16_bits_to_float(b) : half_bits_to_float(b);
}

// mma.sync.m16n8k16.row.col.f32: in = {a0..a3, b0, b1, c0..c3}. Fragment layout (PTX ISA):
// lane (g, t) = (lane / 4, lane % 4) holds A rows g, g + 8 at columns 2t, 2t + 1 (a0, a1) and
// 2t + 8, 2t + 9 (a2, a3); B rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of column g; C/D rows
// g (c0, c1) and g + 8 (c2, c3) at columns 2t, 2t + 1.
template <bool BF16>
inline void combine_mma(Warp& w, unsigned lanes) {
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const unsigned* r = w.in[l];
    a[g][2 * t] = lo_half(r[0], BF16);         a[g][2 * t + 1] = hi_half(r[0], BF16);
    a[g + 8][2 * t] = lo_half(r[1], BF16);     a[g + 8][2 * t + 1] = hi_half(r[1], BF16);
    a[g][2 * t + 8] = lo_half(r[2], BF16);     a[g][2 * t + 9] = hi_half(r[2], BF16);
    a[g + 8][2 * t + 8] = lo_half(r[3], BF16); a[g + 8][2 * t + 9] = hi_half(r[3], BF16);
    b[2 * t][g] = lo_half(r[4], BF16);         b[2 * t + 1][g] = hi_half(r[4], BF16);
    b[2 * t + 8][g] = lo_half(r[5], BF16);     b[2 * t + 9][g] = hi_half(r[5], BF16);
    c[g][2 * t] = u2f(r[6]);     c[g][2 * t + 1] = u2f(r[7]);
    c[g + 8][2 * t] = u2f(r[8]); c[g + 8][2 * t + 1] = u2f(r[9]);
  }
  (void)lanes;
  float d[16][8];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      // Products of 16-bit inputs are exact in fp32; the sum is accumulated in fp32.
      float s = c[i][j];
      for (int k = 0; k < 16; ++k) s += a[i][k] * b[k][j];
      d[i][j] = s;
    }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    w.out[l][0] = f2u(d[g][2 * t]);
    w.out[l][1] = f2u(d[g][2 * t + 1]);
    w.out[l][2] = f2u(d[g + 8][2 * t]);
    w.out[l][3] = f2u(d[g + 8][2 * t + 1]);
  }
}

void mma_sync(bool bf16, float* c, const unsigned* a, unsigned b0, unsigned b1, int line) {
  unsigned in[10] = {a[0], a[1], a[2], a[3], b0, b1, f2u(c[0]), f2u(c[1]), f2u(c[2]), f2u(c[3])};
  unsigned out[4];
  warp_collective(0xffffffffu, in, 10, out, 4,
                  bf16 ? "mma.sync.m16n8k16 (bf16)" : "mma.sync.m16n8k16 (f16)", line,
                  bf16 ? combine_mma<true> : combine_mma<false>);
  for (int i = 0; i < 4; ++i) c[i] = u2f(out[i]);
}

// ldmatrix.m8n8.x4(.trans): lanes 8j .. 8j + 7 give the shared addresses of the 8 rows (16 bytes
// each) of matrix j; lane (g, t) receives, in register j, row g's elements 2t, 2t + 1 (.trans:
// the elements (2t, g) and (2t + 1, g), i.e. of the transpose).
template <bool TRANS>
inline void combine_ldmatrix(Warp& w, unsigned lanes) {
  (void)lanes;
  const unsigned char* rows[4][8];
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 8; ++i) rows[j][i] = shared_at(w.in[8 * j + i][0], 16, "ldmatrix row");
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 4; ++j) {
      unsigned short lo, hi;
      if (!TRANS) {
        std::memcpy(&lo, rows[j][g] + 4 * t, 2);
        std::memcpy(&hi, rows[j][g] + 4 * t + 2, 2);
      } else {
        std::memcpy(&lo, rows[j][2 * t] + 2 * g, 2);
        std::memcpy(&hi, rows[j][2 * t + 1] + 2 * g, 2);
      }
      w.out[l][j] = unsigned(lo) | unsigned(hi) << 16;
    }
  }
}
void ldmatrix(bool trans, unsigned* r, unsigned addr, int line) {
  unsigned in[1] = {addr};
  if (race().base) {  // this lane's row (16 bytes) is read by the collective
    const Fiber& f = cur();
    race_access(shared_at(addr, 16, "ldmatrix row"), 16, false, __builtin_return_address(0),
                L().warps[f.warp].sync);
  }
  warp_collective(0xffffffffu, in, 1, r, 4, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", line,
                  trans ? combine_ldmatrix<true> : combine_ldmatrix<false>);
}

// cp.async: queued per thread, performed when a wait_group covers its group (or at exit).
void cp_async(unsigned dst, const void* src, int bytes, int src_bytes) {
  Fiber& f = cur();
  if (src_bytes < 0 || src_bytes > bytes) {
    fail(std::string("kernel ") + L().kernel + ", " + where(f) + ": cp.async src_bytes=" +
         std::to_string(src_bytes) + " outside [0, " + std::to_string(bytes) + "]");
  }
  unsigned char* d = shared_at(dst, bytes, "cp.async destination");
  f.copies.push_back({d, static_cast<const unsigned char*>(src), src_bytes, f.committed,
                     race().epoch, L().warps[f.warp].sync, __builtin_return_address(0)});
  (void)bytes;
}
// A cp.async copy lands: its source bytes, then zeros to 16 (src_bytes < 16 zero-fills).
inline void land_copy(const PendingCopy& c) {
  if (c.src_bytes) std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(c.dst + c.src_bytes, 0, 16 - c.src_bytes);
}
inline void cp_async_finish(Fiber& f, int keep_groups) {
  // Complete every copy of a committed group older than the newest `keep_groups`.
  const int limit = f.committed - keep_groups;
  size_t kept = 0;
  for (size_t i = 0; i < f.copies.size(); ++i) {
    PendingCopy& c = f.copies[i];
    if (c.group < limit || keep_groups < 0) {
      land_copy(c);
      if (race().base) race_async_landing(c, f);
    } else {
      f.copies[kept++] = c;
    }
  }
  f.copies.resize(kept);
}
void cp_async_commit() { ++cur().committed; }
void cp_async_wait(int n) { cp_async_finish(cur(), n); }

// ----------------------------------------------------------------------------- Hopper (sm_90a)
// mbarriers, named barriers, TMA box copies and wgmma, for Lab 5's Hopper stage
// (reference/include/pagedlab_wgmma.cuh's wrappers). Semantics as in the PTX ISA; what the
// emulator does differently: a wgmma computes when the last thread of its warpgroup issues it
// (fences, commit and wait are then no-ops), and a TMA copy lands when a thread waits on its
// mbarrier (so a read of the box before that wait sees poison, as it may on the GPU).

inline std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

// The shared-memory swizzles of TMA and wgmma (mode 1: 128-byte, 2: 64-byte, 3: 32-byte, 0:
// none): the 16-byte chunk bits of the address XORed with the row bits above them.
inline unsigned swizzle(unsigned a, int mode) {
  static const unsigned rows[4] = {0u, 7u, 3u, 1u};
  return a ^ (((a >> 7) & rows[mode & 3]) << 4);
}

// Kernels that use Hopper's synchronisation are refused under racecheck, whose barrier epochs
// do not model mbarriers, named barriers, TMA or wgmma.
inline void refuse_racecheck() {
  if (race().on) {
    fail(std::string("kernel ") + L().kernel + ": the emulator's racecheck does not model "
         "mbarriers, named barriers, TMA or wgmma (Lab 5.6); run this kernel without racecheck");
  }
}

inline Mbar* find_mbar(unsigned addr) {
  for (Mbar& m : L().mbars)
    if (m.addr == addr) return &m;
  return nullptr;
}

// A Hopper operand or object in shared memory: within what this launch asked for (dynamic bytes
// and static arrays), not just within the emulated device's 228 KiB, which the GPU would not allow.
inline unsigned char* hopper_shared(unsigned addr, size_t bytes, const char* what, int line) {
  Launch& l = L();
  if (size_t(addr) + bytes > l.arena_used) {
    fail(std::string("kernel ") + l.kernel + ", " + where(cur()) + ": " + what + " at line " +
         std::to_string(line) + ", shared address " + hex(addr) + " + " + std::to_string(bytes) +
         " bytes, is past the launch's shared memory (" + std::to_string(l.arena_used) +
         " bytes: the dynamic size it was launched with, then the static arrays)");
  }
  return l.arena + addr;
}

inline Mbar& mbar_at(unsigned addr, const char* what) {
  Mbar* m = find_mbar(addr);
  if (!m) {
    fail(std::string("kernel ") + L().kernel + ", " + where(cur()) + ": " + what +
         " on shared address " + hex(addr) + ", which no mbar_init of this block initialised "
         "(initialise every mbarrier from one thread, then fence_mbarrier_init() and "
         "__syncthreads(), before any thread uses it)");
  }
  unsigned long long bytes;
  std::memcpy(&bytes, L().arena + addr, 8);
  if (bytes != MBAR_COOKIE) {
    fail(std::string("kernel ") + L().kernel + ", " + where(cur()) + ": " + what +
         " on the mbarrier at shared address " + hex(addr) + " (initialised at line " +
         std::to_string(m->init_line) + "), whose 8 bytes something overwrote since (a store, "
         "cp.async or TMA box that overlaps it: check the shared-memory layout)");
  }
  return *m;
}

void mbar_init(unsigned addr, unsigned count, int line) {
  refuse_racecheck();
  unsigned char* p = hopper_shared(addr, 8, "mbar_init", line);
  if (addr % 8) {
    fail(std::string("kernel ") + L().kernel + ", " + where(cur()) + ": mbar_init at line " +
         std::to_string(line) + " on shared address " + hex(addr) + ", not 8-byte aligned");
  }
  if (count < 1 || count > (1u << 20) - 1) {
    fail(std::string("kernel ") + L().kernel + ", " + where(cur()) + ": mbar_init at line " +
         std::to_string(line) + " with count " + std::to_string(count) + " (1 .. 2^20 - 1)");
  }
  Mbar* m = find_mbar(addr);
  if (!m) {
    L().mbars.push_back(Mbar{});
    m = &L().mbars.back();
  }
  m->addr = addr;
  m->count = m->pending = int(count);
  m->tx = 0;
  m->phase = 0;
  m->init_line = line;
  m->copies.clear();
  std::memcpy(p, &MBAR_COOKIE, 8);
}

inline void mbar_maybe_complete(Mbar& m) {
  if (m.pending != 0 || m.tx != 0) return;
  // cp.async copies handed to this barrier land with the phase that waits for them.
  for (const PendingCopy& c : m.copies) land_copy(c);
  m.copies.clear();
  ++m.phase;
  m.pending = m.count;
  Launch& l = L();
  for (Fiber& f : l.fibers)
    if (f.state == AT_MBAR && f.mbar_addr == m.addr) set_state(f, RUNNABLE);  // each re-checks
}

inline void mbar_arrive_on(Mbar& m, const char* what) {
  if (m.pending <= 0) {
    fail(std::string("kernel ") + L().kernel + ", " + where(cur()) + ": " + what +
         " on the mbarrier at shared address " + hex(m.addr) + " (initialised at line " +
         std::to_string(m.init_line) + " for " + std::to_string(m.count) +
         " arrivals): more arrivals in one phase than its count");
  }
  --m.pending;
  mbar_maybe_complete(m);
}

void mbar_arrive(unsigned addr) { mbar_arrive_on(mbar_at(addr, "mbar_arrive"), "mbar_arrive"); }

void mbar_arrive_expect_tx(unsigned addr, unsigned bytes) {
  Mbar& m = mbar_at(addr, "mbar_arrive_expect_tx");
  m.tx += bytes;
  mbar_arrive_on(m, "mbar_arrive_expect_tx");
}

// cp.async.mbarrier.arrive.noinc: the arrival happens once this thread's earlier cp.async copies
// have landed. Here the thread's copies go to the barrier and land when its phase completes
// (so a read before the wait that completes it sees poison), and the arrival counts now.
void mbar_arrive_cp_async(unsigned addr) {
  Mbar& m = mbar_at(addr, "mbar_arrive_cp_async");
  Fiber& f = cur();
  for (const PendingCopy& c : f.copies) m.copies.push_back(c);
  f.copies.clear();
  mbar_arrive_on(m, "mbar_arrive_cp_async");
}

inline unsigned char* tma_global(Launch& l, unsigned long long host, size_t bytes) {
  for (Region& r : l.regions) {
    if (host >= r.host_addr && host + bytes <= r.host_addr + r.nbytes)
      return r.data + (host - r.host_addr);
  }
  return nullptr;
}

// words: 0 magic, 1 address, 2 rank | elem bytes << 8 | swizzle << 16, 3..6 dims,
// 7..9 strides (bytes, dims 1..3), 10..13 box (see reference/tma.py, emulated_map).
inline void land_tma(Launch& l, const TmaCopy& c) {
  const unsigned long long* w = c.words;
  const int rank = int(w[2] & 0xff), elem = int((w[2] >> 8) & 0xff), swz = int((w[2] >> 16) & 3);
  unsigned long long dims[4] = {1, 1, 1, 1}, box[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 0};
  for (int i = 0; i < rank; ++i) {
    dims[i] = w[3 + i];
    box[i] = w[10 + i];
    stride[i] = i == 0 ? (unsigned long long)elem : w[6 + i];
  }
  unsigned long long n = 0;
  for (unsigned long long i3 = 0; i3 < box[3]; ++i3)
    for (unsigned long long i2 = 0; i2 < box[2]; ++i2)
      for (unsigned long long i1 = 0; i1 < box[1]; ++i1)
        for (unsigned long long i0 = 0; i0 < box[0]; ++i0, ++n) {
          const long long x[4] = {c.coords[0] + (long long)i0, c.coords[1] + (long long)i1,
                                  c.coords[2] + (long long)i2, c.coords[3] + (long long)i3};
          bool in = true;
          unsigned long long off = 0;
          for (int d = 0; d < rank; ++d) {
            if (x[d] < 0 || (unsigned long long)x[d] >= dims[d]) in = false;
            else off += (unsigned long long)x[d] * stride[d];
          }
          unsigned char* p = l.arena + swizzle(c.dst + unsigned(n * elem), swz);
          if (in) std::memcpy(p, c.base + off, elem);
          else std::memset(p, 0, elem);  // out of bounds: zero fill (the bytes still count)
        }
  Mbar* m = find_mbar(c.mbar);
  if (m) {  // checked at issue; a later mbar_init of the same address would be a kernel bug
    m->tx -= (long long)c.bytes;
    mbar_maybe_complete(*m);
  }
}

void land_all_tma(Launch& l) {
  std::vector<TmaCopy> copies;
  copies.swap(l.tma);
  for (const TmaCopy& c : copies) land_tma(l, c);
}

inline void land_tma_for(Launch& l, unsigned mbar) {
  if (l.tma.empty()) return;
  std::vector<TmaCopy> keep, now;
  for (TmaCopy& c : l.tma) (c.mbar == mbar ? now : keep).push_back(c);
  l.tma.swap(keep);
  for (const TmaCopy& c : now) land_tma(l, c);
}

// Everything about a TMA load is checked here, at issue, where the error can name the thread
// and the line; the copy itself lands later (see TmaCopy).
void tma_load(unsigned dst, const unsigned long long* w, int rank, const int* coords,
              unsigned mbar, int line) {
  Launch& l = L();
  const std::string at = std::string("kernel ") + l.kernel + ", " + where(cur()) +
                         ": tma_load_" + std::to_string(rank) + "d at line " + std::to_string(line);
  if (w[0] != 0x50414d544c50ull) {  // "PLTMAP": emulated_map's encoding
    fail(at + " through a tensor map the emulator did not make (pass reference.tma.tensor_map(...) "
         "as the kernel argument)");
  }
  if (int(w[2] & 0xff) != rank) fail(at + " through a " + std::to_string(w[2] & 0xff) + "-D tensor map");
  const int elem = int((w[2] >> 8) & 0xff), swz = int((w[2] >> 16) & 3);
  const unsigned align = swz == 1 ? 1024u : swz == 2 ? 512u : swz == 3 ? 256u : 128u;
  if (dst % align) {
    fail(at + " into shared address " + hex(dst) + ": the box must start " +
         std::to_string(align) + "-byte aligned" + (swz ? " (its swizzle pattern's period)" : ""));
  }
  unsigned long long span = elem, bytes = elem;
  for (int i = 0; i < rank; ++i) {
    span += (w[3 + i] - 1) * (i == 0 ? (unsigned long long)elem : w[6 + i]);
    bytes *= w[10 + i];
  }
  TmaCopy c;
  c.base = tma_global(l, w[1], span);
  if (!c.base) {
    fail(at + " through a tensor map whose tensor is not one of this launch's array arguments "
         "(pass the cache itself as an argument too)");
  }
  hopper_shared(dst, bytes, "a TMA box", line);
  mbar_at(mbar, "a TMA load's complete_tx");
  c.dst = dst;
  c.mbar = mbar;
  c.bytes = bytes;
  std::memcpy(c.words, w, sizeof c.words);
  for (int i = 0; i < 5; ++i) c.coords[i] = i < rank ? coords[i] : 0;
  c.rank = rank;
  l.tma.push_back(c);
}

void mbar_wait(unsigned addr, unsigned parity, int line) {
  Launch& l = L();
  Fiber& f = cur();
  for (;;) {
    Mbar& m = mbar_at(addr, "mbar_wait");
    if ((m.phase & 1u) != (parity & 1u)) return;  // the phase of that parity has completed
    // It would block: the copies this barrier counts land now (a wait for a phase that is
    // already over lands nothing, so a read it was meant to guard sees what is there).
    land_tma_for(l, addr);
    if ((m.phase & 1u) != (parity & 1u)) return;
    f.mbar_addr = addr;
    f.mbar_parity = parity & 1u;
    f.wait_file = "";
    f.wait_line = line;
    f.wait_what = "mbar_wait";
    set_state(f, AT_MBAR);
    yield_to_scheduler();
  }
}

void named_bar_sync(int id, int count, int line) {
  Launch& l = L();
  Fiber& f = cur();
  refuse_racecheck();
  if (id < 1 || id > 15 || count <= 0 || count % 32 || count > l.num_threads) {
    fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": named_bar_sync(" +
         std::to_string(id) + ", " + std::to_string(count) + ") at line " + std::to_string(line) +
         ": the id must be 1..15 (0 is __syncthreads()'s) and the count a multiple of 32, at "
         "most the block's " + std::to_string(l.num_threads) + " threads");
  }
  if (l.named_waiting[id] > 0 && l.named_count[id] != count) {
    fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": named barrier " +
         std::to_string(id) + " reached with count " + std::to_string(count) + " at line " +
         std::to_string(line) + " while other threads wait on it with count " +
         std::to_string(l.named_count[id]));
  }
  l.named_count[id] = count;
  if (++l.named_waiting[id] == count) {
    // bar.sync is .aligned: every thread of a warp executes it, so the count is met by whole
    // warps. Counted here thread by thread, a warp that only partly arrived is a kernel bug.
    std::vector<int> per_warp(l.warps.size(), 0);
    for (const Fiber& o : l.fibers)
      if ((o.state == AT_NAMED && o.named_id == id) || &o == &f) ++per_warp[o.warp];
    for (size_t w = 0; w < per_warp.size(); ++w) {
      if (per_warp[w] && per_warp[w] != __builtin_popcount(l.warps[w].exists)) {
        fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": named barrier " +
             std::to_string(id) + " (line " + std::to_string(line) + ") completed its count of " +
             std::to_string(count) + " with only " + std::to_string(per_warp[w]) +
             " threads of warp " + std::to_string(w) + ": bar.sync is executed by whole warps "
             "(call named_bar_sync outside any branch that splits a warp)");
      }
    }
    l.named_waiting[id] = 0;
    for (Fiber& o : l.fibers)
      if (o.state == AT_NAMED && o.named_id == id) set_state(o, RUNNABLE);
    return;
  }
  f.named_id = id;
  f.wait_file = "";
  f.wait_line = line;
  f.wait_what = "named_bar_sync";
  set_state(f, AT_NAMED);
  yield_to_scheduler();
}

[[noreturn]] void hopper_deadlock(Launch& l, const char* head) {
  std::string msg = std::string(head) + "deadlock:";
  for (const Mbar& m : l.mbars) {
    std::vector<int> ids;
    std::vector<int> parities;
    int line = 0;
    for (const Fiber& f : l.fibers)
      if (f.state == AT_MBAR && f.mbar_addr == m.addr) { ids.push_back(f.linear); line = f.wait_line; }
    if (ids.empty()) continue;
    msg += " threads " + thread_list(ids) + " wait (mbar_wait, line " + std::to_string(line) +
           ") on the mbarrier at shared address " + hex(m.addr) + " (initialised at line " +
           std::to_string(m.init_line) + "), whose phase " + std::to_string(m.phase) +
           " never completes: " + std::to_string(m.pending) + " of its " +
           std::to_string(m.count) + " arrivals are missing, and " +
           (m.tx >= 0 ? std::to_string(m.tx) + " transaction bytes"
                      : std::to_string(-m.tx) + " more transaction bytes arrived than expected") +
           ";";
  }
  for (int id = 0; id < 16; ++id) {
    std::vector<int> ids;
    int line = 0;
    for (const Fiber& f : l.fibers)
      if (f.state == AT_NAMED && f.named_id == id) { ids.push_back(f.linear); line = f.wait_line; }
    if (ids.empty()) continue;
    msg += " threads " + thread_list(ids) + " wait at named barrier " + std::to_string(id) +
           " (line " + std::to_string(line) + ") for " + std::to_string(l.named_count[id]) +
           " threads, " + std::to_string(l.named_waiting[id]) + " arrived;";
  }
  std::vector<int> bar, done;
  for (const Fiber& f : l.fibers) {
    if (f.state == AT_BARRIER) bar.push_back(f.linear);
    if (f.state == DONE) done.push_back(f.linear);
  }
  if (!bar.empty()) msg += " threads " + thread_list(bar) + " wait at __syncthreads();";
  if (!done.empty()) msg += " threads " + thread_list(done) + " have exited;";
  msg += " nothing left to run can release them.";
  fail(msg);
}

// ---- wgmma

// Byte address of element (row, k) of a K-major operand (rows: M of A, N of B), or of (k, col)
// of an MN-major one, in the canonical layouts of the PTX ISA's shared-memory matrix
// descriptor: start, leading and stride byte offsets, swizzle 0 (none, 8 x 16-byte core
// matrices), 1 (128-byte), 2 (64-byte), 3 (32-byte); the swizzle XORs the 16-byte chunk bits
// of the address with the row bits above them.
inline unsigned desc_addr(unsigned long long desc, int mn, int k, bool mn_major) {
  if ((desc >> 49) & 7) {
    fail(std::string("kernel ") + L().kernel + ": a wgmma descriptor with a nonzero base offset "
         "(bits 49-51): the emulator models tiles that start on their swizzle pattern's period");
  }
  const unsigned start = unsigned(desc & 0x3FFF) << 4;
  const unsigned lead = unsigned((desc >> 16) & 0x3FFF) << 4;
  const unsigned stride = unsigned((desc >> 32) & 0x3FFF) << 4;
  const int swz = int(desc >> 62);
  const int width = swz == 1 ? 128 : swz == 2 ? 64 : swz == 3 ? 32 : 16;  // bytes per row of an atom
  const int per_row = width / 2;  // 16-bit elements
  unsigned a;
  if (!mn_major) {
    if (swz == 0) a = start + (mn / 8) * stride + (mn % 8) * 16 + (k / 8) * lead + (k % 8) * 2;
    else a = start + (mn / 8) * stride + (mn % 8) * width + k * 2;
  } else {
    if (swz == 0) a = start + (mn / 8) * stride + (mn % 8) * 2 + (k / 8) * lead + (k % 8) * 16;
    else a = start + (mn / per_row) * lead + (mn % per_row) * 2 + (k / 8) * stride + (k % 8) * width;
  }
  return swizzle(a, swz);
}

inline float smem_half(unsigned addr, bool bf16, int line) {
  unsigned short b;
  std::memcpy(&b, hopper_shared(addr, 2, "a wgmma operand", line), 2);
  return bf16 ? bf16_bits_to_float(b) : half_bits_to_float(b);
}

inline void wgmma_compute(WarpGroupOp& op) {
  const WgmmaLane& l0 = op.lane[0];
  const int n = l0.n;
  const bool bf16 = l0.bf16;
  static thread_local std::vector<float> A, B, D;
  A.assign(64 * 16, 0.f);
  B.assign(16 * size_t(n), 0.f);
  if (l0.a_regs) {
    for (int t = 0; t < 128; ++t) {
      const int w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
      const unsigned* r = op.lane[t].a;
      const int r0 = 16 * w + g, r1 = r0 + 8;
      A[r0 * 16 + 2 * q] = lo_half(r[0], bf16);     A[r0 * 16 + 2 * q + 1] = hi_half(r[0], bf16);
      A[r1 * 16 + 2 * q] = lo_half(r[1], bf16);     A[r1 * 16 + 2 * q + 1] = hi_half(r[1], bf16);
      A[r0 * 16 + 2 * q + 8] = lo_half(r[2], bf16); A[r0 * 16 + 2 * q + 9] = hi_half(r[2], bf16);
      A[r1 * 16 + 2 * q + 8] = lo_half(r[3], bf16); A[r1 * 16 + 2 * q + 9] = hi_half(r[3], bf16);
    }
  } else {
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) A[m * 16 + k] = smem_half(desc_addr(l0.a_desc, m, k, false), bf16, l0.line);
  }
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < n; ++j)
      B[k * n + j] = smem_half(desc_addr(l0.b_desc, j, k, l0.b_mn_major), bf16, l0.line);
  for (int t = 0; t < 128; ++t) {
    const WgmmaLane& me = op.lane[t];
    const int w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
    for (int j = 0; j < n / 8; ++j)
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * w + g + 8 * (e / 2), col = 8 * j + 2 * q + (e % 2);
        float s = me.scale_d ? me.d[4 * j + e] : 0.f;
        for (int k = 0; k < 16; ++k) s += A[row * 16 + k] * B[k * n + col];
        me.d[4 * j + e] = s;
      }
  }
}

void wgmma(int n, bool bf16, float* d, const unsigned* a, unsigned long long a_desc,
           unsigned long long b_desc, int scale_d, bool b_mn_major, int line) {
  Launch& l = L();
  Fiber& f = cur();
  const int group = f.linear / 128, t = f.linear % 128;
  if ((group + 1) * 128 > l.num_threads) {
    fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": wgmma at line " +
         std::to_string(line) + " in a warpgroup that is not whole (the block has " +
         std::to_string(l.num_threads) + " threads; warpgroups are 128 consecutive threads)");
  }
  refuse_racecheck();
  WarpGroupOp& op = l.wgops[group];
  WgmmaLane& me = op.lane[t];
  me.d = d;
  if (a) std::memcpy(me.a, a, sizeof me.a);
  me.a_desc = a_desc;
  me.b_desc = b_desc;
  me.n = n;
  me.scale_d = scale_d;
  me.line = line;
  me.bf16 = bf16;
  me.a_regs = a != nullptr;
  me.b_mn_major = b_mn_major;
  if (++op.arrived < 128) {
    f.wait_what = "wgmma";
    f.wait_file = "";
    f.wait_line = line;
    set_state(f, AT_WARP_OP);
    yield_to_scheduler();
    return;
  }
  for (int i = 0; i < 128; ++i) {
    const WgmmaLane& o = op.lane[i];
    if (o.n != n || o.bf16 != bf16 || o.a_regs != me.a_regs || o.b_mn_major != b_mn_major ||
        o.a_desc != a_desc || o.b_desc != b_desc || o.scale_d != scale_d) {
      fail(std::string("kernel ") + l.kernel + ", " + where(f) + ": the threads of warpgroup " +
           std::to_string(group) + " meet at different wgmma (line " + std::to_string(o.line) +
           ", thread " + std::to_string(group * 128 + i) + ", and line " + std::to_string(line) +
           ") or with different descriptors or scale-d: one wgmma is one instruction of all "
           "128 threads");
    }
  }
  wgmma_compute(op);
  op.arrived = 0;
  for (int i = 0; i < 128; ++i) {
    Fiber& o = l.fibers[group * 128 + i];
    if (&o != &f && o.state == AT_WARP_OP) set_state(o, RUNNABLE);
  }
}

void wgmma_deadlock(Launch& l, const char* head) {
  for (size_t g = 0; g < l.wgops.size(); ++g) {
    const WarpGroupOp& op = l.wgops[g];
    if (!op.arrived) continue;
    std::vector<int> waiting, missing;
    std::string why;
    for (int i = 0; i < 128; ++i) {
      const Fiber& f = l.fibers[g * 128 + i];
      if (f.state == AT_WARP_OP && f.wait_what && std::strcmp(f.wait_what, "wgmma") == 0) {
        waiting.push_back(f.linear);
      } else {
        missing.push_back(f.linear);
        if (why.empty())
          why = f.state == DONE ? "exited"
                                : std::string("waits at ") + (f.wait_what ? f.wait_what : "?") +
                                      " (line " + std::to_string(f.wait_line) + ")";
      }
    }
    fail(head + std::string("deadlock: threads ") + thread_list(waiting) + " wait in wgmma at line " +
         std::to_string(op.lane[waiting.empty() ? 0 : waiting[0] % 128].line) + " for threads " +
         thread_list(missing) + " of their warpgroup, which never arrive (the first " + why +
         "). All 128 threads of a warpgroup issue every wgmma together.");
  }
}

}  // namespace pagedlab_emu

// ----------------------------------------------------------------------------- launch

namespace pagedlab_emu {

}  // namespace pagedlab_emu

extern "C" PL_HIDDEN void pl_emu_fiber_main(pagedlab_emu::Fiber* f) {
  using namespace pagedlab_emu;
  Launch& l = L();
  l.tramp(l.args);
  cp_async_finish(*f, -1);  // copies still in flight land before the thread retires
  set_state(*f, DONE);
  yield_to_scheduler();
  __builtin_trap();  // a finished fiber is never resumed
}

namespace pagedlab_emu {

// ----------------------------------------------------------------------------- traps

struct TrapState {
  struct sigaction old_segv, old_bus, old_fpe, old_vtalrm;
  struct itimerval old_timer;
  stack_t old_stack;
  std::vector<unsigned char> alt;
};

inline double time_limit_s() {
  const char* env = std::getenv("PAGEDLAB_EMU_TIMEOUT");
  const double v = env ? std::atof(env) : 0.0;
  return v > 0 ? v : 120.0;
}

inline std::string describe_fault(void* addr, bool is_write, int sig) {
  Launch& l = L();
  Fiber* f = current_ref();
  std::string who = std::string("kernel ") + l.kernel + ", " + (f ? where(*f) : "?") + ": ";
  if (sig == SIGFPE) return who + "arithmetic trap (an integer division by zero?)";
  if (sig == SIGVTALRM) {
    return who + "still running after " + std::to_string(int(time_limit_s())) +
           " s of CPU time (PAGEDLAB_EMU_TIMEOUT): an endless loop? (the thread named is the "
           "one that was running when the limit hit)";
  }
  const unsigned char* a = static_cast<const unsigned char*>(addr);
  const Region* best = nullptr;
  long long best_dist = 0;
  for (const Region& r : l.regions) {
    long long d = 0;
    if (a < r.data) d = r.data - a;
    else if (a >= r.data + r.nbytes) d = a - (r.data + r.nbytes) + 1;
    if (!best || d < best_dist) { best = &r; best_dist = d; }
  }
  for (const Fiber& fb : l.fibers) {
    if (a >= fb.stack - 4096 && a < fb.stack) {
      return who + "stack overflow (a local array too large for the emulated thread's stack?)";
    }
  }
  const std::string kind = is_write ? "write" : "read";
  if (best && a >= best->map && a < best->map + best->map_bytes) {
    const long long byte = a - best->data;
    const long long index = byte >= 0 ? byte / best->elem_size : -((-byte + best->elem_size - 1) / best->elem_size);
    const long long n = (long long)(best->nbytes / best->elem_size);
    if (byte >= 0 && byte < (long long)best->nbytes && best->is_const) {
      return who + "write to " + best->name + "[" + std::to_string(index) + "], but " +
             best->name + " is a const input (declared `const T*`)";
    }
    return who + "out-of-bounds " + kind + " of " + best->name + " at element index " +
           std::to_string(index) + " (" + best->name + " has " + std::to_string(n) +
           " elements of " + std::to_string(best->elem_size) + " bytes" +
           (index >= n ? "; a wide (vector) access may have started a few elements earlier"
                       : "") + ")";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%p", addr);
  std::string msg = who + "invalid " + kind + " at address " + buf + ", inside no kernel argument";
  if (best) {
    const long long byte = a - best->data;
    msg += std::string(" (nearest array: ") + best->name + ", element index " +
           std::to_string(byte / best->elem_size) + ")";
  }
  return msg;
}

inline bool fill_lazy_page(Launch& l, const void* addr);

inline void on_trap(int sig, siginfo_t* info, void* ctx) {
  Launch* l = launch_ref();
  if (!l || !l->running) {  // not ours
    if (sig == SIGVTALRM) return;  // the alarm hit another thread: the launch is over soon
    signal(sig, SIG_DFL);
    return;
  }
  // First touch of a lazy array's page: copy it in and retry the access.
  if ((sig == SIGSEGV || sig == SIGBUS) && fill_lazy_page(*l, info->si_addr)) return;
  bool is_write = false;
#if defined(__x86_64__) && defined(__linux__)
  is_write = (static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
  (void)ctx;
#endif
  l->error = describe_fault(info->si_addr, is_write, sig);
  siglongjmp(l->jmp, sig == SIGVTALRM ? 3 : 1);
}

inline void install_traps(TrapState& t) {
  t.alt.resize(1 << 16);
  stack_t ss{};
  ss.ss_sp = t.alt.data();
  ss.ss_size = t.alt.size();
  sigaltstack(&ss, &t.old_stack);
  struct sigaction sa {};
  sa.sa_sigaction = on_trap;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &t.old_segv);
  sigaction(SIGBUS, &sa, &t.old_bus);
  sigaction(SIGFPE, &sa, &t.old_fpe);
  // An endless loop in a kernel must cost its test, not hang the run: a CPU-time alarm.
  sigaction(SIGVTALRM, &sa, &t.old_vtalrm);
  struct itimerval it {};
  const double limit = time_limit_s();
  it.it_value.tv_sec = (long)limit;
  it.it_value.tv_usec = (long)((limit - (long)limit) * 1e6);
  setitimer(ITIMER_VIRTUAL, &it, &t.old_timer);
}
inline void remove_traps(TrapState& t) {
  setitimer(ITIMER_VIRTUAL, &t.old_timer, nullptr);
  sigaction(SIGVTALRM, &t.old_vtalrm, nullptr);
  sigaction(SIGSEGV, &t.old_segv, nullptr);
  sigaction(SIGBUS, &t.old_bus, nullptr);
  sigaction(SIGFPE, &t.old_fpe, nullptr);
  sigaltstack(&t.old_stack, nullptr);
}

// ----------------------------------------------------------------------------- regions

inline size_t page_size() { return size_t(sysconf(_SC_PAGESIZE)); }
constexpr size_t GUARD_BYTES = size_t(1) << 30;  // inaccessible on both sides of every array

// Copies a host buffer into a fenced mapping: the array's last byte touches the upper guard.
constexpr size_t LAZY_BYTES = size_t(256) << 20;

inline bool make_region(Region& r, const BufferArg& b) {
  const size_t page = page_size();
  const size_t data_pages = (b.nbytes + page - 1) / page + 1;
  r.map_bytes = 2 * GUARD_BYTES + data_pages * page;
  void* m = mmap(nullptr, r.map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return false;
  r.map = static_cast<unsigned char*>(m);
  unsigned char* lo = r.map + GUARD_BYTES;
  unsigned char* hi = lo + data_pages * page;
  const bool lazy = b.nbytes >= LAZY_BYTES;
  if (!lazy && mprotect(lo, data_pages * page, PROT_READ | PROT_WRITE) != 0) return false;
  // End-aligned, but keep the alignment a vector load needs (16 bytes when the size allows it).
  const size_t align = b.nbytes % 16 == 0 ? 16 : (b.elem_size > 0 ? size_t(b.elem_size) : 1);
  uintptr_t start = (uintptr_t)(hi - b.nbytes);
  start -= start % align;
  r.data = reinterpret_cast<unsigned char*>(start);
  r.nbytes = b.nbytes;
  r.elem_size = b.elem_size > 0 ? b.elem_size : 1;
  r.is_const = b.is_const != 0;
  r.name = b.name;
  r.host_addr = b.host;
  if (lazy) {
    r.lazy = true;
    r.host = reinterpret_cast<const unsigned char*>(b.host);
    r.pages_lo = lo;
    r.touched.assign(data_pages, 0);
    return true;
  }
  if (b.nbytes) std::memcpy(r.data, reinterpret_cast<const void*>(b.host), b.nbytes);
  if (r.is_const) {  // inputs are read-only: a write traps
    const uintptr_t first = (uintptr_t)r.data / page * page;
    mprotect(reinterpret_cast<void*>(first), (uintptr_t)hi - first, PROT_READ);
  }
  return true;
}

// Copies in the page of a lazy region that `addr` falls in (see Region). False when `addr` is
// no untouched page of a lazy array (an out-of-bounds access, or a write to a const input).
inline bool fill_lazy_page(Launch& l, const void* addr) {
  const size_t page = page_size();
  const unsigned char* a = static_cast<const unsigned char*>(addr);
  for (Region& r : l.regions) {
    if (!r.lazy || a < r.pages_lo || a >= r.pages_lo + r.touched.size() * page) continue;
    const size_t k = size_t(a - r.pages_lo) / page;
    if (r.touched[k]) return false;
    unsigned char* p = r.pages_lo + k * page;
    if (mprotect(p, page, PROT_READ | PROT_WRITE) != 0) return false;
    unsigned char* from = std::max(p, r.data);
    unsigned char* to = std::min(p + page, r.data + r.nbytes);
    if (from < to) std::memcpy(from, r.host + (from - r.data), size_t(to - from));
    if (r.is_const) mprotect(p, page, PROT_READ);
    r.touched[k] = 1;
    return true;
  }
  return false;
}

// A lazy output array goes back page by page: only what the kernel touched.
inline void copy_back_lazy(const Region& r, unsigned char* host) {
  const size_t page = page_size();
  for (size_t k = 0; k < r.touched.size(); ++k) {
    if (!r.touched[k]) continue;
    unsigned char* p = r.pages_lo + k * page;
    unsigned char* from = std::max(p, r.data);
    unsigned char* to = std::min(p + page, r.data + r.nbytes);
    if (from < to) std::memcpy(host + (from - r.data), from, size_t(to - from));
  }
}

inline void free_regions(Launch& l) {
  for (Region& r : l.regions)
    if (r.map) munmap(r.map, r.map_bytes);
  l.regions.clear();
}

// ----------------------------------------------------------------------------- the scheduler

constexpr size_t STACK_BYTES = size_t(256) << 10;
constexpr size_t SHARED_CAP = size_t(228) << 10;  // H100 / H200: 227 KiB per block + slack

// Canary bytes just past the shared memory a block has: a GPU faults on a shared access past
// the launch's size ("out of range shared or local address"); the arena here is larger, so a
// write there is found by checking the canary after the block (reads past it are not found).
constexpr size_t SHARED_GUARD_BYTES = size_t(16) << 10;
constexpr unsigned char SHARED_CANARY = 0xa5;

inline void check_shared_guard(Launch& l) {
  for (size_t i = l.arena_used; i < l.guard_end; ++i) {
    if (l.arena[i] == SHARED_CANARY) continue;
    const size_t static_bytes = l.arena_used - (l.dyn_bytes + 127) / 128 * 128;
    fail(std::string("kernel ") + l.kernel + ", block (" + std::to_string(l.bid.x) + "," +
         std::to_string(l.bid.y) + "," + std::to_string(l.bid.z) + "): wrote shared memory " +
         "byte " + std::to_string(i) + ", past the block's " + std::to_string(l.arena_used) +
         " bytes (the launch's dynamic shared memory, shared_mem=" +
         std::to_string(l.dyn_bytes) + ", rounded up to 128" +
         (static_bytes ? ", then " + std::to_string(static_bytes) + " bytes of __shared__ arrays"
                       : std::string()) +
         "): on a GPU an out-of-range shared address; is shared_mem too small for what the " +
         "kernel stores?");
  }
}

inline void run_block(Launch& l) {
  // Fresh shared memory for every block: poison what the kernel used so far.
  if (l.poisoned) std::memset(l.arena, 0xff, l.poisoned);
  l.guard_end = std::min(l.arena_cap, l.arena_used + SHARED_GUARD_BYTES);
  std::memset(l.arena + l.arena_used, SHARED_CANARY, l.guard_end - l.arena_used);
  ++race().epoch;  // another block's shared memory: nothing before is related
  for (Warp& w : l.warps) w.arrived = 0;
  l.n_runnable = l.num_threads;
  l.n_barrier = l.n_warp = l.n_done = l.n_mbar = l.n_named = 0;
  l.mbars.clear();
  l.tma.clear();
  for (int i = 0; i < 16; ++i) l.named_waiting[i] = l.named_count[i] = 0;
  l.wgops.assign((l.num_threads + 127) / 128, WarpGroupOp{});
  for (Fiber& f : l.fibers) {
    f.state = RUNNABLE;
    f.copies.clear();
    f.committed = 0;
    prepare_fiber(f);
  }
  // Warp-major, run-ahead order: warp 0 runs as far as it can (to a __syncthreads or its end)
  // before warp 1 starts. A warp that writes shared memory another warp has not read yet, or
  // reads what another warp has not written yet, then sees the wrong value every time: a
  // missing barrier shows up as a wrong answer (or poisoned NaN), not as a lucky pass.
  const int num_warps = int(l.warps.size());
  while (l.n_done < l.num_threads) {
    for (int w = 0; w < num_warps; ++w) {
      const int lo = w * 32, hi = std::min(lo + 32, l.num_threads);
      for (bool again = true; again;) {
        again = false;
        for (int i = lo; i < hi; ++i)
          if (l.fibers[i].state == RUNNABLE) { switch_to(l.fibers[i]); again = true; }
      }
    }
    current_ref() = nullptr;
    if (l.n_runnable == 0 && l.n_done < l.num_threads) resolve_block(l);
  }
  if (!l.tma.empty()) land_all_tma(l);  // copies no thread waited for still land
  check_shared_guard(l);
}

}  // namespace pagedlab_emu

// Runs one kernel over the grid. Returns 0, or a non-zero code with the message in `err`.
extern "C" PL_EXPORT int pagedlab_emu_run(const pagedlab_emu::KernelEntry* k,
                                          const unsigned* grid, const unsigned* block,
                                          unsigned long long dyn_smem, int nbuf,
                                          const pagedlab_emu::BufferArg* bufs, int nargs,
                                          const pagedlab_emu::KernelArg* args, char* err,
                                          int errlen) {
  using namespace pagedlab_emu;
  Launch* lp = new Launch();
  Launch& l = *lp;
  launch_ref() = lp;
  l.kernel = k->name;
  l.tramp = k->call;
  l.grid = dim3(grid[0], grid[1], grid[2]);
  l.block = dim3(block[0], block[1], block[2]);
  l.num_threads = int(block[0] * block[1] * block[2]);
  int rc = 0;
  std::vector<void*> argv(nargs);
  std::vector<void*> ptrs(nargs);
  TrapState traps;
  auto finish = [&](int code) {
    if (code && err && errlen > 0) std::snprintf(err, errlen, "%s", l.error.c_str());
    for (Fiber& f : l.fibers)
      if (f.stack) munmap(f.stack - page_size(), f.stack_bytes + page_size());
    if (l.arena) munmap(l.arena, SHARED_CAP);
    free_regions(l);
    launch_ref() = nullptr;
    current_ref() = nullptr;
    delete lp;
    std::fflush(stdout);
    return code;
  };
  if (dyn_smem > SHARED_CAP) {
    l.error = std::string("kernel ") + l.kernel + ": " + std::to_string(dyn_smem) +
              " bytes of dynamic shared memory requested; the emulated device has " +
              std::to_string(SHARED_CAP);
    return finish(3);
  }
  for (int i = 0; i < nbuf; ++i) {
    l.regions.emplace_back();
    if (!make_region(l.regions.back(), bufs[i])) {
      l.error = "could not map memory for argument " + std::string(bufs[i].name);
      return finish(3);
    }
  }
  for (int i = 0; i < nargs; ++i) {
    if (args[i].kind == 1) {
      ptrs[i] = l.regions[args[i].buf].data + args[i].value;
      argv[i] = &ptrs[i];
    } else if (args[i].kind == 2) {
      ptrs[i] = reinterpret_cast<void*>(args[i].value);
      argv[i] = &ptrs[i];
    } else if (args[i].kind == 3) {  // a struct by value: its bytes live at `value`
      argv[i] = reinterpret_cast<void*>(args[i].value);
    } else {
      argv[i] = const_cast<unsigned long long*>(&args[i].value);
    }
  }
  l.args = argv.data();
  l.arena = static_cast<unsigned char*>(
      mmap(nullptr, SHARED_CAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  l.arena_cap = SHARED_CAP;
  RaceState& race_state = race();
  race_state.hazards.clear();
  race_state.total = 0;
  race_state.report.clear();
  if (race_state.on) {  // fresh shadow per launch (12 MiB; only racecheck builds pay it)
    race_state.base = l.arena;
    race_state.cap = SHARED_CAP;
    race_state.cells.assign(SHARED_CAP, RaceCell{});
  }
  l.dyn_bytes = dyn_smem;
  l.arena_used = (dyn_smem + 127) / 128 * 128;
  l.poisoned = l.arena_used;
  l.fibers.resize(l.num_threads);
  l.warps.resize((l.num_threads + 31) / 32);
  const size_t page = page_size();
  for (int i = 0; i < l.num_threads; ++i) {
    Fiber& f = l.fibers[i];
    unsigned char* m = static_cast<unsigned char*>(mmap(nullptr, STACK_BYTES + page,
                                                        PROT_READ | PROT_WRITE,
                                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                                        -1, 0));
    mprotect(m, page, PROT_NONE);  // guard page under the stack
    f.stack = m + page;
    f.stack_bytes = STACK_BYTES;
    f.linear = i;
    f.tid = {unsigned(i) % block[0], (unsigned(i) / block[0]) % block[1],
             unsigned(i) / (block[0] * block[1])};
    f.warp = i / 32;
    f.lane = i % 32;
    l.warps[f.warp].exists |= 1u << f.lane;
    f.copies.reserve(64);
  }
  install_traps(traps);
  l.running = true;
  if (sigsetjmp(l.jmp, 1) == 0) {
    for (unsigned z = 0; z < grid[2]; ++z)
      for (unsigned y = 0; y < grid[1]; ++y)
        for (unsigned x = 0; x < grid[0]; ++x) {
          l.bid = {x, y, z};
          run_block(l);
        }
    // Success: the argument arrays go back to the caller's memory.
    for (int i = 0; i < nbuf; ++i) {
      if (bufs[i].is_const || !bufs[i].nbytes) continue;
      if (l.regions[i].lazy)
        copy_back_lazy(l.regions[i], reinterpret_cast<unsigned char*>(bufs[i].host));
      else
        std::memcpy(reinterpret_cast<void*>(bufs[i].host), l.regions[i].data, bufs[i].nbytes);
    }
  } else {
    rc = 1;
  }
  l.running = false;
  remove_traps(traps);
  if (race_state.on) race_finish_launch();
  return finish(rc);
}

// Racecheck on or off for this library's next launches (it must be built with -fsanitize=thread
// for the hooks to see the kernel's accesses: emulate.py builds a separate library for it).
extern "C" PL_EXPORT void pagedlab_emu_set_racecheck(int on) {
  pagedlab_emu::race().on = on != 0;
  if (!on) {
    pagedlab_emu::race().cells.clear();
    pagedlab_emu::race().cells.shrink_to_fit();
  }
}

// The last launch's hazards (one line per site, see race_finish_launch); returns how many
// conflicting byte accesses were seen in all.
extern "C" PL_EXPORT long long pagedlab_emu_race_report(char* buf, int len) {
  const pagedlab_emu::RaceState& r = pagedlab_emu::race();
  if (buf && len > 0) std::snprintf(buf, len, "%s", r.report.c_str());
  return r.total;
}

