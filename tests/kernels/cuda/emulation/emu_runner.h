// The emulation's scheduler (with emu_prelude.h): run_grid runs a kernel body over a grid,
// one block at a time, one fiber per CUDA thread, switching fibers only at barriers and warp
// collectives, in a shuffled order (g_shuffle) with warps now and then stalled behind the
// others (g_stall_warps), and stops with "DEADLOCK" when no fiber can move. Shared by every
// emulation test under tests/kernels/cuda (emulation/BUILD says how a test uses it).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <utility>
#include <vector>

namespace emu {
inline constexpr size_t kStack = 256 * 1024;
inline std::function<void()>* g_body;
inline std::mt19937 g_sched_rng(1);
inline bool g_shuffle = true;
// Stalls (on unless a test turns them off): now and then one warp of the block is left
// unscheduled for up to 255 rounds, or until the others cannot move without it, so that they
// run ahead of it as far as the kernel's barriers let them. A missing barrier between a
// warp's last read of a buffer and another warp's next write to it then shows, where fair
// rounds keep the warps within a barrier step or two of each other.
inline bool g_stall_warps = true;
inline void trampoline() {
  (*g_body)();
  g_cur->done = true;
  g_live--;
  g_progress++;
}
// A grid of `block`-thread blocks, one block at a time, in x-fastest order; `before_block`
// (when given) runs before each block's fibers start (e.g. to poison shared memory).
inline void run_grid(dim3 grid, unsigned block, std::function<void()> body,
                     const std::function<void()>& before_block = {}) {
  g_grid_dim = {grid.x, grid.y, grid.z};
  g_block_dim = {block, 1, 1};
  g_body = &body;
  static std::vector<char> stacks;
  stacks.resize(kStack * block);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::vector<Fiber> fibers(block);
        g_block_bar = {};
        g_warp_bar.assign((block + 31) / 32, {});
        g_slots.assign(block, {});
        g_live = block;
        if (before_block) before_block();
        for (unsigned t = 0; t < block; ++t) {
          Fiber& f = fibers[t];
          f.tidx = {t, 0, 0};
          f.bidx = {bx, by, bz};
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = &stacks[kStack * t];
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = &g_sched;
          makecontext(&f.ctx, trampoline, 0);
        }
        std::vector<int> order(block);
        for (unsigned t = 0; t < block; ++t) order[t] = t;
        const unsigned warps = (block + 31) / 32;
        int stalled = -1;     // the warp left out, or -1
        unsigned rounds = 0;  // rounds it stays left out
        for (;;) {
          bool any = false;
          long before = g_progress;
          if (g_shuffle) std::shuffle(order.begin(), order.end(), g_sched_rng);
          if (g_stall_warps && stalled < 0 && warps > 1 && g_sched_rng() % 8 == 0) {
            stalled = static_cast<int>(g_sched_rng() % warps);
            rounds = g_sched_rng() % 256;
          }
          for (int t : order) {
            if (fibers[t].done) continue;
            any = true;
            if (t / 32 == stalled) continue;
            g_cur = &fibers[t];
            swapcontext(&g_sched, &fibers[t].ctx);
          }
          if (!any) break;
          const bool moved = g_progress != before;
          if (stalled >= 0 && (!moved || rounds-- == 0)) {  // the others wait for it: resume it
            stalled = -1;
            continue;
          }
          if (!moved) {
            fprintf(stderr, "DEADLOCK in block (%u, %u, %u)\n", bx, by, bz);
            exit(2);
          }
        }
        for (auto& f : fibers)
          if (!f.pending.empty()) {
            fprintf(stderr, "cp.async left pending at exit\n");
            exit(2);
          }
      }
}
// `grid` blocks along x (and `grid_y` along y).
inline void run_grid(unsigned grid, unsigned block, std::function<void()> body,
                     unsigned grid_y = 1) {
  run_grid(dim3(grid, grid_y, 1), block, std::move(body));
}
}  // namespace emu
