// FASTMETAL_* environment variables, each parsed in one place: the backend-neutral ones here
// (env_config.cpp), a backend's own in its folder (cpu/cpu_env.h: FASTMETAL_NUM_THREADS,
// FASTMETAL_CPU_ISA, FASTMETAL_EMULATOR_SEED; the CUDA backend's
// FASTMETAL_CUDA_INLINE_ARGS where it is built). A setting that is not understood is never
// ignored silently: its parser returns the default and report()s one line naming the
// variable, the value and the accepted values, which `import fastmetal` turns into a
// RuntimeWarning (config_problems()).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fm::env {

// Records a problem with a variable (deduplicated).
void report(const std::string& problem);
// Every problem report()ed so far.
std::vector<std::string> reported();
// Every problem with a setting read at start-up: builds the device registry first (each
// backend parses its own settings as it is made; registry.cpp), so this is complete at import.
std::vector<std::string> config_problems();

// FASTMETAL_DEVICE: the default device's name as set, "" where unset or empty (the
// registry checks it against the devices there are).
std::string device();

// Tuning and test hooks of the ops, read on every call (tests set them while running):
// FASTMETAL_CONV_TILE: the GEMM tile conv2d must use ("128x128", "64x128", "64x64",
// "32x64"; ops/conv2d.cpp matches it against its tiles), "" where unset.
std::string conv_tile();
// FASTMETAL_CONV_SPLITS: the split count forced on conv2d's gradients (the integer prefix
// of the value, as atoll reads it), none where unset or empty.
std::optional<std::int64_t> conv_splits();
// FASTMETAL_CONV_ALGO where Winograd applies: "gemm", "winograd" (F(2x2, 3x3)) or
// "winograd4" (F(4x4, 3x3)) as the output tile m: 0, 2 or 4; -1 (the op chooses) where
// unset or anything else.
int conv_algo();
// FASTMETAL_MATMUL_TILE: the GEMM tile matmul must use ("128x128", "64x128", "64x64",
// "32x64"; ops/matmul.cpp matches it against its tiles), "" where unset.
std::string matmul_tile();
// FASTMETAL_MATMUL_SPLITS: the number of K splits forced on matmul (the integer prefix of
// the value; 0, the op chooses, where unset or not positive).
std::int64_t matmul_splits();
// FASTMETAL_ELEMENTWISE_GRID: 16-byte chunks per thread of a wide elementwise launch: an
// integer J > 0 as set; kGridDevice for "device" (as many threads as the device runs at
// once); 0 (the default grid) where unset or anything else.
constexpr std::int64_t kGridDevice = -1;
std::int64_t elementwise_grid();
// FASTMETAL_SDPA_FORWARD: which fused attention forward serves head dims <= 64 on the GPU
// kernels, to measure them with one build: "tiled" (sdpa_forward_tiled's 32 KiB instance, the
// default on every device) 1, "classic" (sdpa_forward) 0, "split" (its 40 KiB instance: K and
// V staged together) 2, "prefetch" (40 KiB, the next tile loaded during this one) 3; -1 (the
// op chooses) where unset; anything else is report()ed and gives -1. Where the device lacks
// the 40 KiB instances (Metal), split and prefetch run tiled.
int sdpa_forward();
// FASTMETAL_SDPA_BACKWARD: the same for the backward: "tiled" (sdpa_backward_dkdv_tiled and
// sdpa_backward_dq_tiled, the default) or "classic" (sdpa_backward_dkdv / _dq); 1, 0, -1 as
// above.
int sdpa_backward();
// FASTMETAL_COMPILE_FUSION: whether fastmetal.compile folds elementwise launches into the
// kernels before them (ops/capture_fusion.h): "1" (the default where unset) or "0" (off: to
// measure the fusions, or to rule them out). Anything else is report()ed and gives 1.
bool compile_fusion();
// FASTMETAL_COMPILE_STREAMS: on how many streams a compiled step's CUDA graph is recorded,
// so that launches which do not depend on each other run side by side
// (capture_order.h): "1" (the list's order, one chain) to "8"; 4 where unset (on an H100
// the MNIST step ran 0.286 ms on 4, 0.289 on 8, 0.325 on 1). Anything else is report()ed
// and gives 4.
int compile_streams();

}  // namespace fm::env
