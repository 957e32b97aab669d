// Entry points the CPU shim's barrier and simdgroup functions call. They are implemented
// by the CPU emulator (csrc/backend/cpu/emulator.cpp), which runs each simulated GPU thread
// as a fiber and switches fibers at these points. Outside the emulator they abort the
// launch with an error: a kernel that needs barriers cannot run as a plain loop.
#pragma once

namespace fm_cpu_hooks {
void barrier();
void simd_barrier();
float simd_sum(float v);
float simd_max(float v);
float simd_shuffle_down(float v, unsigned short delta);
float simd_broadcast(float v, unsigned short lane);
}  // namespace fm_cpu_hooks
