// Undo the keyword macros of compat/cuda/metal_stdlib (see compat/cpu/fm_end.h).
#pragma once
#undef kernel
#undef device
#undef thread
#undef constant
#undef threadgroup
#undef float2
#undef float3
#undef float4
#undef int2
#undef int3
#undef int4
#undef uint2
#undef uint3
#undef uint4
