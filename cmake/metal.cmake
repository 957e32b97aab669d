# The Metal backend (macOS), included by CMakeLists.txt when FASTMETAL_METAL is ON, or AUTO
# on macOS. AUTO builds it where Apple's Metal compiler works and otherwise warns and builds
# the CPU backend only; ON stops with the fix instead.
#
#   metal/*.metal --xcrun metal--> build/metal/*.air --xcrun metallib--> fastmetal.metallib
#   fastmetal.metallib --.incbin (metallib_embed.S)--> the _core extension
#   csrc/backend/metal/*.mm (Objective-C++, ARC) --> _core, linked with Metal, Foundation
#   and CoreGraphics (without it MTLCreateSystemDefaultDevice() can return nil in a
#   command-line process such as python)
#
# The functions below are also used on their own by tools/ci/check_metal_cmake.sh, which runs
# them on Linux with a stand-in xcrun (set FM_METAL_FUNCTIONS_ONLY before including).

set(FM_METAL_ROOT ${CMAKE_CURRENT_LIST_DIR}/..)  # the repository
set(FM_METAL_STD "metal3.0")        # Metal 3.0: macOS 13 and later
set(FM_METAL_MIN_MACOS "13.0")

# Finds xcrun and checks that it can run Apple's Metal compiler. Sets FM_XCRUN, or (with
# SOFT) leaves FM_METAL_TOOLCHAIN_PROBLEM set to what is missing and how to fix it; without
# SOFT a missing compiler stops the configure with that message.
function(fm_find_metal_toolchain)
  cmake_parse_arguments(ARG "SOFT" "" "" ${ARGN})
  set(FM_METAL_TOOLCHAIN_PROBLEM "" PARENT_SCOPE)
  find_program(FM_XCRUN xcrun)
  if(NOT FM_XCRUN)
    set(problem
      "fastmetal: FASTMETAL_METAL=ON needs Apple's Metal shader compiler "
      "(`xcrun -sdk macosx metal`), but `xcrun` was not found.\n"
      "On macOS install the Xcode command-line tools (`xcode-select --install`) or Xcode; "
      "elsewhere, or to build the CPU backend only, configure with -DFASTMETAL_METAL=OFF "
      "(pip: `pip install . -C cmake.define.FASTMETAL_METAL=OFF`).")
    if(ARG_SOFT)
      set(FM_METAL_TOOLCHAIN_PROBLEM "${problem}" PARENT_SCOPE)
      return()
    endif()
    message(FATAL_ERROR "${problem}")
  endif()
  # Preprocess __METAL_VERSION__: proves the compiler runs (with Xcode 26 the Metal
  # toolchain is a separate download) and that it knows the language version we need.
  set(probe ${CMAKE_BINARY_DIR}/metal/metal_version_probe.metal)
  file(WRITE ${probe} "__METAL_VERSION__\n")
  execute_process(
    COMMAND ${FM_XCRUN} -sdk macosx metal -std=${FM_METAL_STD} -E -P -x metal ${probe}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REGEX MATCH "[0-9]+" version "${out}")
  if(NOT rc EQUAL 0 OR NOT version OR version LESS 300)
    set(problem
      "fastmetal: `xcrun -sdk macosx metal -std=${FM_METAL_STD}` does not work "
      "(exit ${rc}, __METAL_VERSION__='${out}'): ${err}\n"
      "Install Xcode or its command-line tools with the Metal toolchain "
      "(Xcode 26+: `xcodebuild -downloadComponent MetalToolchain`), or configure with "
      "-DFASTMETAL_METAL=OFF to build the CPU backend only.")
    if(ARG_SOFT)
      set(FM_METAL_TOOLCHAIN_PROBLEM "${problem}" PARENT_SCOPE)
      return()
    endif()
    message(FATAL_ERROR "${problem}")
  endif()
  message(STATUS "fastmetal: Metal compiler found (__METAL_VERSION__ ${version})")
  set(FM_XCRUN ${FM_XCRUN} PARENT_SCOPE)
endfunction()

# Compiles `sources` (.metal) into one metallib at `out` and adds the custom target
# `target` that builds it. The sources include headers from metal/ and the generated
# elementwise_ops.h, so every .air depends on those and on the generator's stamp.
function(fm_add_metallib target out)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;INCLUDE_DIRS;DEPENDS" ${ARGN})
  set(deploy ${FM_METAL_MIN_MACOS})
  if(CMAKE_OSX_DEPLOYMENT_TARGET AND CMAKE_OSX_DEPLOYMENT_TARGET VERSION_GREATER deploy)
    set(deploy ${CMAKE_OSX_DEPLOYMENT_TARGET})
  endif()
  set(includes "")
  foreach(dir ${ARG_INCLUDE_DIRS})
    list(APPEND includes -I ${dir})
  endforeach()
  get_filename_component(out_dir ${out} DIRECTORY)
  file(MAKE_DIRECTORY ${out_dir})
  set(airs "")
  foreach(src ${ARG_SOURCES})
    get_filename_component(stem ${src} NAME_WE)
    set(air ${out_dir}/${stem}.air)
    # The metallib must load on the oldest macOS we support, whatever SDK builds it. Apple's
    # Metal compiler ignores MACOSX_DEPLOYMENT_TARGET and stamps the SDK's version unless
    # the target is on its command line.
    add_custom_command(
      OUTPUT ${air}
      COMMAND ${FM_XCRUN} -sdk macosx metal -std=${FM_METAL_STD} -mmacosx-version-min=${deploy}
              -fno-fast-math ${includes} -c ${src} -o ${air}
      DEPENDS ${src} ${ARG_HEADERS} ${ARG_DEPENDS}
      COMMENT "Compiling ${stem}.metal with Apple's Metal compiler"
      VERBATIM)
    list(APPEND airs ${air})
  endforeach()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${FM_XCRUN} -sdk macosx metallib ${airs} -o ${out}
    DEPENDS ${airs}
    COMMENT "Linking ${out}"
    VERBATIM)
  add_custom_target(${target} DEPENDS ${out})
endfunction()

# Embeds the metallib at `metallib` into `target` (symbols fastmetal_metallib_start/_end);
# the object is re-assembled whenever the metallib changes.
# Needs enable_language(ASM) at file scope first.
function(fm_embed_metallib target metallib metallib_target)
  set(FM_METALLIB ${metallib})
  set(embed ${CMAKE_BINARY_DIR}/metal/metallib_embed.S)
  configure_file(${FM_METAL_ROOT}/csrc/backend/metal/metallib_embed.S.in ${embed} @ONLY)
  set_source_files_properties(${embed} PROPERTIES LANGUAGE ASM OBJECT_DEPENDS ${metallib})
  target_sources(${target} PRIVATE ${embed})
  add_dependencies(${target} ${metallib_target})
endfunction()

if(FM_METAL_FUNCTIONS_ONLY)
  return()
endif()

if(FASTMETAL_METAL STREQUAL "AUTO")
  fm_find_metal_toolchain(SOFT)
  if(FM_METAL_TOOLCHAIN_PROBLEM)
    message(WARNING "${FM_METAL_TOOLCHAIN_PROBLEM}\n"
      "FASTMETAL_METAL=AUTO: building WITHOUT the Metal backend (CPU only). Install the Metal "
      "toolchain and reinstall to get it, or pass -DFASTMETAL_METAL=OFF to silence this.")
    return()
  endif()
else()
  fm_find_metal_toolchain()
endif()
if(NOT APPLE)
  message(FATAL_ERROR
    "fastmetal: FASTMETAL_METAL=ON builds the Metal backend, which needs macOS "
    "(Metal.framework). Configure with -DFASTMETAL_METAL=OFF on ${CMAKE_SYSTEM_NAME}.")
endif()

enable_language(ASM)
enable_language(OBJCXX)
fm_add_metallib(fm_metallib ${CMAKE_BINARY_DIR}/metal/fastmetal.metallib
  SOURCES ${FM_METAL_SOURCES}
  HEADERS ${FM_METAL_HEADERS}
  INCLUDE_DIRS ${CMAKE_SOURCE_DIR}/metal ${FM_GEN_DIR}
  DEPENDS ${FM_GEN_DIR}/generated.stamp)
add_dependencies(fm_metallib fm_generated)
fm_embed_metallib(_core ${CMAKE_BINARY_DIR}/metal/fastmetal.metallib fm_metallib)

# The Objective-C++ host: the only .mm files, compiled with ARC.
file(GLOB FM_METAL_HOST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/csrc/backend/metal/*.mm)
target_sources(_core PRIVATE ${FM_METAL_HOST_SOURCES})
set_source_files_properties(${FM_METAL_HOST_SOURCES} PROPERTIES LANGUAGE OBJCXX)
target_compile_options(_core PRIVATE $<$<COMPILE_LANGUAGE:OBJCXX>:-fobjc-arc>)
target_compile_definitions(_core PRIVATE FASTMETAL_HAVE_METAL)
target_link_libraries(_core PRIVATE "-framework Metal" "-framework Foundation"
                                    "-framework CoreGraphics")
