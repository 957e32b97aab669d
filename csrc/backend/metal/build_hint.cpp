// Compiled into every build, Metal or not: what device_problems() says where this build has
// no Metal backend (registry.h).
#include "../registry.h"

#if defined(__APPLE__)
FM_BUILD_HINT("metal", 10,
              "this build was configured with FASTMETAL_METAL=OFF or without Apple's Metal "
              "compiler");
#else
FM_BUILD_HINT("metal", 10, "Metal needs macOS and an Apple GPU");
#endif
