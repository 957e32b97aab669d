// Undo the keyword macros (and fma/rint) of compat/cpu/metal_stdlib, so code after the .metal file
// (generated launch entries, system headers) sees ordinary C++ again.
#pragma once
#undef kernel
#undef device
#undef thread
#undef constant
#undef threadgroup
#undef fma
#undef rint
