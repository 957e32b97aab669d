# The optional CUDA backend. FASTMETAL_CUDA: ON (required), OFF, or AUTO (when nvcc exists
# and this machine has an NVIDIA GPU: `nvidia-smi -L` lists one or /dev/nvidiactl exists;
# a compiler alone is not a reason to spend minutes compiling kernels nothing here can run).
# Sets FM_WITH_CUDA and FM_CUDA_ENTRIES for the generator; fm_add_cuda_backend(target)
# compiles the generated wrappers and the host code into `target`.
set(FM_WITH_CUDA OFF)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # Turing .. Hopper as machine code, plus PTX that newer GPUs compile at load time.
  set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 90-real 90-virtual)
endif()
set(FM_CUDA_WANTED ${FASTMETAL_CUDA})
if(FASTMETAL_CUDA STREQUAL "AUTO" AND NOT APPLE)
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE FM_NVSMI_RC OUTPUT_QUIET ERROR_QUIET)
  if(NOT FM_NVSMI_RC EQUAL 0 AND NOT EXISTS /dev/nvidiactl)
    message(STATUS "fastmetal: no NVIDIA GPU here; CUDA backend skipped (FASTMETAL_CUDA=ON builds it)")
    set(FM_CUDA_WANTED OFF)
  endif()
endif()
if(NOT FM_CUDA_WANTED STREQUAL "OFF" AND NOT APPLE)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FM_WITH_CUDA ON)
  elseif(FASTMETAL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FASTMETAL_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

set(FM_CUDA_ENTRIES "")
if(FM_WITH_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  foreach(src ${FM_METAL_SOURCES})
    get_filename_component(stem ${src} NAME_WE)
    list(APPEND FM_CUDA_ENTRIES ${FM_GEN_DIR}/cuda_entries_${stem}.cu)
  endforeach()
  message(STATUS "fastmetal: CUDA backend ON (${CMAKE_CUDA_COMPILER}, archs ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "fastmetal: CUDA backend OFF")
endif()

function(fm_add_cuda_backend target)
  # The conv2d GEMM kernels: at most 128 registers a thread gives two 256-thread groups (four
  # 128-thread ones) per multiprocessor instead of one; their double-buffered paths fit
  # without spilling (ptxas -v; only the any-group-size fallback spills a little).
  # The matmul GEMM tiles likewise (metal/matmul.metal: 64 accumulators a thread at 8x8).
  set_source_files_properties(${FM_GEN_DIR}/cuda_entries_conv2d.cu ${FM_GEN_DIR}/cuda_entries_matmul.cu
    PROPERTIES COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CUDA>:-maxrregcount=128>")
  # Attention's: uncapped, ptxas (CUDA 13, sm_90) gives the tiled kernels 138 (dQ) to 175
  # (dK/dV) registers (2-3 groups of 128 threads per multiprocessor); at 128 they run 4
  # groups, with at most ~1 spill load per 64 FMAs in their loops. The cap is per file, set
  # on both attention files (forwards and backwards), and with it ptxas gives the classic
  # kernels more registers than uncapped (dq_d128 57 -> 80, dkdv_d128 97 -> 123: 8 -> 6 and
  # 5 -> 4 groups; spills none). Measured on an H100 (2026-11-28, bench attention --shapes
  # long): capped at 128, forward 333-481 us at 4 x 8 x 1024; uncapped 362-767 us (the
  # non-causal forward 1.6x slower) and forward+backward 1.1-1.3x slower. So 128 stays;
  # FASTMETAL_ATTENTION_MAXRREG (0: uncapped) lets one build try another cap.
  set(FASTMETAL_ATTENTION_MAXRREG 128 CACHE STRING
      "nvcc -maxrregcount for the attention kernels (0: none)")
  set(attention_entries ${FM_GEN_DIR}/cuda_entries_attention_forward.cu
      ${FM_GEN_DIR}/cuda_entries_attention_backward.cu)
  foreach(f ${attention_entries})  # a renamed metal/attention_*.metal must not lose the cap
    if(NOT f IN_LIST FM_CUDA_ENTRIES)
      message(FATAL_ERROR "cmake/cuda.cmake: ${f} is not generated; update its name here")
    endif()
  endforeach()
  if(FASTMETAL_ATTENTION_MAXRREG GREATER 0)
    set_source_files_properties(${attention_entries} PROPERTIES COMPILE_OPTIONS
      "$<$<COMPILE_LANGUAGE:CUDA>:-maxrregcount=${FASTMETAL_ATTENTION_MAXRREG}>")
  endif()
  add_library(fm_cuda_kernels OBJECT ${FM_CUDA_ENTRIES})
  add_dependencies(fm_cuda_kernels fm_generated)
  set_target_properties(fm_cuda_kernels PROPERTIES CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_include_directories(fm_cuda_kernels PRIVATE
    ${CMAKE_SOURCE_DIR}/metal/compat/cuda ${CMAKE_SOURCE_DIR}/metal ${FM_GEN_DIR}
    ${CMAKE_SOURCE_DIR}/csrc/backend/cuda)
  target_compile_options(fm_cuda_kernels PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3 -Xcompiler=-fPIC>)
  target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/csrc/backend/cuda/cuda_backend.cpp
                 $<TARGET_OBJECTS:fm_cuda_kernels>)
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/csrc/backend/cuda)
  target_compile_definitions(${target} PRIVATE FASTMETAL_HAVE_CUDA)
  # The static runtime: the wheel needs only the NVIDIA driver, found at run time.
  target_link_libraries(${target} PRIVATE CUDA::cudart_static)
endfunction()
