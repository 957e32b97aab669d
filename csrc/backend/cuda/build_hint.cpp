// Compiled into every build, CUDA or not: what device_problems() says where this build has
// no CUDA backend (registry.h).
#include "../registry.h"

FM_BUILD_HINT("cuda", 20, "build with FASTMETAL_CUDA=ON where nvcc and an NVIDIA GPU are present");
