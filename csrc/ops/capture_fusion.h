// fastmetal.compile's fusion pass: after a step is recorded (backend/capture.h) and before
// its first replay, elementwise launches that only finish what the launch before them
// wrote are folded into that launch, so a replay reads and writes the intermediate never:
//   conv2d's GEMM forward (conv2d_forward_<tile>), then relu -> its _relu instance;
//   conv2d's Winograd output transform, then relu -> it applies relu too (FM_CONV_RELU);
//   an elementwise float32 add (a linear layer's bias), then relu -> its add_relu twin;
//   the Winograd output transform of an input gradient, then relu_grad(it, y)
//     -> the transform masks by y as it stores (FM_CONV_RELU_MASK, y bound to `bias`);
//   max_pool2d_backward_cells(gy, x), then relu_grad(it, x)
//     -> the pooling backward masks the winner by x (PoolArgs::relu_mask).
// Each fused kernel computes what the two launches computed, bit for bit (the same fm_relu
// and relu_grad expressions), so a replay still equals eager execution exactly.
// A fusion is made only where it cannot be observed:
//   - nothing outside the capture holds the intermediate's storage (no Array of the user's,
//     no autograd graph, no input or output), the elementwise launch names it last, and the
//     producer just before (earlier launches may have written it: an add in place);
//   - the fused launch runs where the elementwise one ran, and nothing between the two
//     touches a buffer the producer reads (so moving it later reads the same values);
//   - neither launch is in a region Python re-runs in patch mode (those rewrite arguments).
// FASTMETAL_COMPILE_FUSION=0 turns the pass off.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace fm {
namespace capture {
class Capture;
}

// Folds what it can in `c` (entries in `fixed`, [begin, end) ranges, are left alone) and
// returns the number of launches folded.
std::size_t fuse_capture(capture::Capture& c,
                         const std::vector<std::pair<std::size_t, std::size_t>>& fixed);

}  // namespace fm
