// fastmetal.random's kernels (metal/random.metal) behind private entry points: the public
// functions, the generators and the argument checks are python/fastmetal/random.py. Each
// entry fills a contiguous float32 Array that random.py allocated on the chosen device
// (the Array argument carries the device and the shape) and returns it. (The binding hands
// the op a contiguous float32 Array: the caller's own when it is one, else a copy, which
// the fill would then miss; random.py passes a fresh fastmetal.empty.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "core/errors.h"
#include "random_args.h"
#include "ops/kernel_group.h"
#include "ops/python_op.h"

namespace fm {
namespace {

constexpr std::int64_t kMax32 = std::numeric_limits<std::uint32_t>::max();

// Finite once rounded to float32, where the kernels compute (NaN fails too).
bool finite_in_float32(double v) { return std::fabs(v) <= std::numeric_limits<float>::max(); }

// The parts of RandomArgs every draw has: size, key and counter (checked here too, though
// random.py already did: these are reachable from fastmetal._core).
RandomArgs draw_args(const char* op, const Array& out, std::int64_t key0, std::int64_t key1,
                     std::int64_t counter) {
  if (key0 < 0 || key0 > kMax32 || key1 < 0 || key1 > kMax32)
    throw ValueError(message(op, "expected key words in [0, 2**32), got ", key0, " and ", key1));
  if (counter < 0) throw ValueError(message(op, "expected a counter >= 0, got ", counter));
  // Thread g makes elements 4g .. 4g + 3 and the grid is 32-bit.
  if (std::uint64_t(out.size()) > 4u * std::uint64_t(kMax32))
    throw ValueError(message(op, "expected at most 4 * (2**32 - 1) elements, got ", out.size()));
  prepare_write(out, op, "out");
  RandomArgs a{};
  a.n = std::uint64_t(out.size());
  a.key0 = std::uint32_t(key0);
  a.key1 = std::uint32_t(key1);
  a.counter = std::uint64_t(counter);
  return a;
}

// Launches `kernel` over the whole blocks (four elements a thread) and `kernel`_tail over
// the last n % 4 elements (one thread).
Array launch(const std::string& kernel, const Array& out, RandomArgs a) {
  Backend& be = out.backend();
  auto run = [&](const std::string& name, std::uint32_t threads) {
    std::uint32_t group = kernel_group_size();  // tests vary it; 0: the backend's choice
    if (group == 0) group = be.preferred_group_size(name);
    Dispatch d;
    d.grid[0] = threads;
    d.group[0] = std::max<std::uint32_t>(1, std::min(group, threads));
    d.cost = 16;  // ten Philox rounds per four elements
    be.launch(name, d, {KernelArg::buffer(out.storage, out.byte_offset()),
                        KernelArg::inline_bytes(&a, sizeof a)});
  };
  const std::uint32_t whole = std::uint32_t(a.n / 4u);
  if (whole > 0) run(kernel, whole);
  if (a.n % 4u != 0) {
    a.first = whole;
    run(kernel + "_tail", 1);
  }
  return out;
}

}  // namespace

Array random_uniform(const Array& out, std::int64_t key0, std::int64_t key1, std::int64_t counter,
                     double low, double high, std::int64_t bits) {
  const char* op = "random.uniform";
  RandomArgs a = draw_args(op, out, key0, key1, counter);
  const double range = high - low;
  if (!finite_in_float32(low) || !(range >= 0) || !finite_in_float32(range))
    throw ValueError(message(op, "expected finite low <= high with high - low finite in float32, "
                                 "got low=", low, ", high=", high));
  if (bits < 1 || bits > 24) throw ValueError(message(op, "expected bits in [1, 24], got ", bits));
  a.a = float(low);
  a.b = float(range);
  a.bits = std::uint32_t(bits);
  return launch("random_uniform", out, a);
}
FM_PYTHON_OP(random_uniform,
             "_random_uniform(out: Array, key0: int, key1: int, counter: int, low: float, "
             "high: float, bits: int)",
             "Private: fills out with low + (high - low) * u (see fastmetal/random.py).");

Array random_normal(const Array& out, std::int64_t key0, std::int64_t key1, std::int64_t counter,
                    double mean, double stddev) {
  const char* op = "random.normal";
  RandomArgs a = draw_args(op, out, key0, key1, counter);
  if (!finite_in_float32(mean) || !finite_in_float32(stddev) || !(stddev >= 0))
    throw ValueError(message(op, "expected finite mean and std >= 0, got mean=", mean, ", std=",
                             stddev));
  a.a = float(mean);
  a.b = float(stddev);
  return launch("random_normal", out, a);
}
FM_PYTHON_OP(random_normal,
             "_random_normal(out: Array, key0: int, key1: int, counter: int, mean: float, "
             "std: float)",
             "Private: fills out with mean + std * Box-Muller normals (see fastmetal/random.py).");

Array random_bernoulli(const Array& out, std::int64_t key0, std::int64_t key1,
                       std::int64_t counter, std::int64_t threshold) {
  const char* op = "random.bernoulli";
  RandomArgs a = draw_args(op, out, key0, key1, counter);
  if (threshold < 0 || threshold > (std::int64_t(1) << 24))
    throw ValueError(message(op, "expected a threshold in [0, 2**24], got ", threshold));
  a.threshold = std::uint32_t(threshold);
  return launch("random_bernoulli", out, a);
}
FM_PYTHON_OP(random_bernoulli,
             "_random_bernoulli(out: Array, key0: int, key1: int, counter: int, threshold: int)",
             "Private: fills out with 1 where a word's 24 high bits are below threshold, else 0 "
             "(see fastmetal/random.py).");

}  // namespace fm
