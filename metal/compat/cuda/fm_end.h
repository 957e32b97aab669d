// Undo the keyword macros of compat/cuda/metal_stdlib: the same keywords as the CPU shim's,
// plus the renamed vector types.
#pragma once
#include "../cpu/fm_end.h"
#undef float2
#undef float3
#undef float4
#undef int2
#undef int3
#undef int4
#undef uint2
#undef uint3
#undef uint4
