// The emulation's scheduler (with emu_prelude.h): run_grid runs a kernel body over a grid,
// one block at a time, one fiber per CUDA thread, switching fibers only at barriers and warp
// collectives, in a shuffled order (g_shuffle), and stops with "DEADLOCK" when no fiber can
// move. Shared by the attention and norm emulation tests.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

namespace emu {
inline constexpr size_t kStack = 256 * 1024;
inline std::function<void()>* g_body;
inline std::mt19937 g_sched_rng(1);
inline bool g_shuffle = true;
inline void trampoline() {
  (*g_body)();
  g_cur->done = true;
  g_live--;
  g_progress++;
}
// `grid` blocks along x (and `grid_y` along y) of `block` threads each, one block at a time.
inline void run_grid(unsigned grid, unsigned block, std::function<void()> body,
                     unsigned grid_y = 1) {
  g_grid_dim = {grid, grid_y, 1};
  g_block_dim = {block, 1, 1};
  g_body = &body;
  static std::vector<char> stacks;
  stacks.resize(kStack * block);
  for (unsigned block_index = 0; block_index < grid * grid_y; ++block_index) {
    const unsigned bx = block_index % grid, by = block_index / grid;
    std::vector<Fiber> fibers(block);
    g_block_bar = {};
    g_warp_bar.assign((block + 31) / 32, {});
    g_slots.assign(block, {});
    g_live = block;
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = fibers[t];
      f.tidx = {t, 0, 0};
      f.bidx = {bx, by, 0};
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = &stacks[kStack * t];
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = &g_sched;
      makecontext(&f.ctx, trampoline, 0);
    }
    std::vector<int> order(block);
    for (unsigned t = 0; t < block; ++t) order[t] = t;
    for (;;) {
      bool any = false;
      long before = g_progress;
      if (g_shuffle) std::shuffle(order.begin(), order.end(), g_sched_rng);
      for (int t : order) {
        if (fibers[t].done) continue;
        any = true;
        g_cur = &fibers[t];
        swapcontext(&g_sched, &fibers[t].ctx);
      }
      if (!any) break;
      if (g_progress == before) {
        fprintf(stderr, "DEADLOCK in block (%u, %u)\n", bx, by);
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
}  // namespace emu
