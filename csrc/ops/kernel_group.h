// Tests: threads per group for the reduction and matmul kernels (0: the op's own choice),
// so that the kernels are checked at group sizes other than the ones the ops pick.
#pragma once
#include <cstdint>

namespace fm {

void set_kernel_group_size(std::uint32_t threads);
std::uint32_t kernel_group_size();

}  // namespace fm
