// Exact CPU emulation of threadgroups, the test oracle for kernels that use barriers.
//
// Every simulated GPU thread of a group is a fiber (ucontext). A fiber runs until it
// reaches threadgroup_barrier or a simdgroup function, then hands control back to the
// scheduler, which resumes a *randomly chosen* ready fiber: a kernel missing a barrier
// reads data another thread has not written yet and gives wrong results. The barrier
// opens when every thread of the group has arrived; a simdgroup function completes when
// every lane of its simdgroup has called it. A thread that exits while others wait at a
// barrier, or lanes that disagree on the simdgroup function, are reported as errors.
//
// `threadgroup` arrays are `static thread_local` in the CPU shim: all fibers of a group
// run on one OS thread, so they share them exactly as a threadgroup shares its memory.
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fm_cpu_hooks.h"
#include "cpu_kernel_abi.h"
#include "cpu_env.h"

namespace fm::cpu {
namespace {

constexpr std::size_t kStackBytes = 256 * 1024;

enum class State { ready, at_barrier, at_simd, done };
enum class SimdOp { sum, max, shuffle_down, broadcast, barrier };

struct Fiber {
  ucontext_t ctx;
  State state = State::ready;
  ThreadIds ids;
  SimdOp simd_op = SimdOp::sum;
  unsigned simd_arg = 0;
  float simd_in = 0, simd_out = 0;
};

struct Group {
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  ucontext_t scheduler;
  int current = -1;
  const std::function<void(const ThreadIds&)>* body = nullptr;
  std::string error;
};

thread_local Group* g_group = nullptr;

void fiber_entry() {
  Group* g = g_group;
  Fiber& f = g->fibers[g->current];
  (*g->body)(f.ids);
  f.state = State::done;
  // uc_link returns to the scheduler
}

Fiber& current_fiber(const char* what) {
  if (g_group == nullptr || g_group->current < 0)
    throw std::logic_error(std::string(what) +
                           " called outside the CPU emulator: a kernel that synchronises "
                           "threads must be launched in emulated mode");
  return g_group->fibers[g_group->current];
}

void yield(Fiber& f, State s) {
  f.state = s;
  swapcontext(&f.ctx, &g_group->scheduler);
}

float simd_call(SimdOp op, float v, unsigned arg) {
  Fiber& f = current_fiber("a simdgroup function");
  f.simd_op = op;
  f.simd_arg = arg;
  f.simd_in = v;
  yield(f, State::at_simd);
  return f.simd_out;
}

std::uint64_t seed_for_launch() {
  static std::atomic<std::uint64_t> counter{0};
  if (const std::optional<std::uint64_t> seed = env_emulator_seed())
    return *seed + counter.fetch_add(1);
  return std::random_device{}() ^ (counter.fetch_add(1) << 32);
}

// Completes the simdgroup call of `sg` if all its live lanes have arrived.
bool try_complete_simd(Group& g, std::uint32_t sg) {
  std::vector<Fiber*> lanes;
  for (auto& f : g.fibers)
    if (f.ids.simd_group == sg) lanes.push_back(&f);
  for (Fiber* f : lanes) {
    if (f->state == State::ready) return false;
    if (f->state != State::at_simd) {
      g.error = "lanes of one simdgroup diverged: some reached a simdgroup function, others a "
                "threadgroup barrier or the kernel's end";
      return false;
    }
  }
  const SimdOp op = lanes[0]->simd_op;
  for (Fiber* f : lanes)
    if (f->simd_op != op || (op == SimdOp::broadcast && f->simd_arg != lanes[0]->simd_arg)) {
      g.error = "lanes of one simdgroup called different simdgroup functions";
      return false;
    }
  const std::size_t n = lanes.size();
  float acc = op == SimdOp::max ? -INFINITY : 0.0f;
  for (Fiber* f : lanes) acc = op == SimdOp::max ? std::max(acc, f->simd_in) : acc + f->simd_in;
  for (std::size_t i = 0; i < n; ++i) {
    Fiber* f = lanes[i];
    switch (op) {
      case SimdOp::sum:
      case SimdOp::max: f->simd_out = acc; break;
      case SimdOp::shuffle_down:
        f->simd_out = i + f->simd_arg < n ? lanes[i + f->simd_arg]->simd_in : f->simd_in;
        break;
      case SimdOp::broadcast:
        f->simd_out = f->simd_arg < n ? lanes[f->simd_arg]->simd_in : f->simd_in;
        break;
      case SimdOp::barrier: f->simd_out = f->simd_in; break;
    }
    f->state = State::ready;
  }
  return true;
}

void run_group(Group& g, std::mt19937_64& rng) {
  const std::size_t n = g.fibers.size();
  while (g.stacks.size() < n) g.stacks.emplace_back(kStackBytes);
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = g.fibers[i];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g.stacks[i].data();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &g.scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
    f.state = State::ready;
  }
  std::vector<int> ready;
  for (;;) {
    ready.clear();
    std::size_t done = 0, at_barrier = 0, at_simd = 0;
    for (std::size_t i = 0; i < n; ++i) {
      switch (g.fibers[i].state) {
        case State::ready: ready.push_back(int(i)); break;
        case State::done: ++done; break;
        case State::at_barrier: ++at_barrier; break;
        case State::at_simd: ++at_simd; break;
      }
    }
    if (!ready.empty()) {
      g.current = ready[rng() % ready.size()];
      swapcontext(&g.scheduler, &g.fibers[g.current].ctx);
      g.current = -1;
      continue;
    }
    if (done == n) return;
    bool progressed = false;
    if (at_simd > 0) {
      std::vector<bool> tried(n / kSimdWidth + 2, false);
      for (auto& f : g.fibers)
        if (f.state == State::at_simd && !tried[f.ids.simd_group]) {
          tried[f.ids.simd_group] = true;
          progressed |= try_complete_simd(g, f.ids.simd_group);
          if (!g.error.empty()) return;
        }
    }
    if (progressed) continue;
    if (at_barrier == n) {
      for (auto& f : g.fibers) f.state = State::ready;
      continue;
    }
    g.error = done > 0 ? "threads of a group exited while others waited at threadgroup_barrier "
                         "(an early return before a barrier?)"
                       : "threads of a group are waiting for each other forever (barrier inside "
                         "divergent control flow?)";
    return;
  }
}

}  // namespace

void emulate_groups(const Launch& L, const std::function<void(const ThreadIds&)>& body) {
  Group g;
  g.body = &body;
  std::mt19937_64 rng(seed_for_launch());
  Group* saved = g_group;
  g_group = &g;
  try {
    for (std::uint64_t gi = L.group_begin; gi < L.group_end; ++gi) {
      const std::uint64_t gx = L.num_groups.x, gy = L.num_groups.y;
      const uvec3 gp{std::uint32_t(gi % gx), std::uint32_t((gi / gx) % gy),
                     std::uint32_t(gi / (gx * gy))};
      g.fibers.clear();
      for (std::uint32_t lz = 0; lz < L.group.z; ++lz)
        for (std::uint32_t ly = 0; ly < L.group.y; ++ly)
          for (std::uint32_t lx = 0; lx < L.group.x; ++lx) {
            ThreadIds t;
            t.grid_size = L.grid;
            t.group_size = L.group;
            t.num_groups = L.num_groups;
            t.group_pos = gp;
            t.local_pos = uvec3{lx, ly, lz};
            t.grid_pos = uvec3{gp.x * L.group.x + lx, gp.y * L.group.y + ly, gp.z * L.group.z + lz};
            if (t.grid_pos.x >= L.grid.x || t.grid_pos.y >= L.grid.y || t.grid_pos.z >= L.grid.z)
              continue;
            t.local_index = (lz * L.group.y + ly) * L.group.x + lx;
            t.simd_width = kSimdWidth;
            t.simd_lane = t.local_index % kSimdWidth;
            t.simd_group = t.local_index / kSimdWidth;
            Fiber f;
            f.ids = t;
            g.fibers.push_back(f);
          }
      run_group(g, rng);
      if (!g.error.empty()) throw std::runtime_error("CPU emulator: " + g.error);
    }
  } catch (...) {
    g_group = saved;
    throw;
  }
  g_group = saved;
}

}  // namespace fm::cpu

namespace fm_cpu_hooks {
using fm::cpu::SimdOp;
void barrier() {
  auto& f = fm::cpu::current_fiber("threadgroup_barrier");
  fm::cpu::yield(f, fm::cpu::State::at_barrier);
}
void simd_barrier() { fm::cpu::simd_call(SimdOp::barrier, 0.0f, 0); }
float simd_sum(float v) { return fm::cpu::simd_call(SimdOp::sum, v, 0); }
float simd_max(float v) { return fm::cpu::simd_call(SimdOp::max, v, 0); }
float simd_shuffle_down(float v, unsigned short d) {
  return fm::cpu::simd_call(SimdOp::shuffle_down, v, d);
}
float simd_broadcast(float v, unsigned short lane) {
  return fm::cpu::simd_call(SimdOp::broadcast, v, lane);
}
}  // namespace fm_cpu_hooks
