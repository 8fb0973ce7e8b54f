# cohort_find_torch([HINTS <dir>...])
# Finds LibTorch for cohort/torch/ and defines two imported targets: cohort::libtorch (LibTorch's
# headers and libraries) and cohort::torch (cohort::cohort, which must exist, plus cohort::libtorch
# and COHORT_WITH_TORCH=1: what a program using cohort/torch/ links), so that neither cohort's build
# nor a find_package(cohort) consumer has to handle a pip wheel's CUDA dependencies by hand.
#
# Where it looks, first match wins: Torch_DIR; each CMAKE_PREFIX_PATH entry (variable, then
# environment), as find_package would; HINTS (folders holding TorchConfig.cmake, or Python venvs
# with torch installed in them); the system's folders (Debian's libtorch-dev).
#
# What it links:
# - A LibTorch built without CUDA (Debian's 1.13) through its own TorchConfig.cmake (target torch).
# - A LibTorch built with CUDA (the torch wheel from PyPI) through its own TorchConfig.cmake too
#   when its CUDA libraries are installed beside it and a CUDA toolkit is found (the GPU machine),
#   with -rpath-link to the wheel's nvidia/*/lib folders so that the linker takes the wheel's NCCL,
#   cuDNN, ... and not a system copy. COHORT_TORCH_CUDA=ON forces this.
# - Otherwise (COHORT_TORCH_CUDA=OFF, or AUTO without those libraries) its CPU libraries alone,
#   libtorch_cpu and libc10: what a CPU build loads. With the wheel, libtorch_cpu.so still needs the
#   CUDA runtime and CUPTI (nvidia-cuda-runtime, nvidia-cuda-cupti), found through its own RPATH.
#
# Sets COHORT_TORCH_FOUND, COHORT_TORCH_VERSION (from torch/version.h), COHORT_TORCH_DIR (the
# folder of TorchConfig.cmake; an installed cohort-config.cmake looks there) and
# COHORT_TORCH_WITH_CUDA (ON when libtorch_cuda is linked).
set(COHORT_TORCH_CUDA AUTO CACHE STRING "Link LibTorch's CUDA libraries: AUTO (when installed beside it), ON or OFF")
set_property(CACHE COHORT_TORCH_CUDA PROPERTY STRINGS AUTO ON OFF)

# The folder holding TorchConfig.cmake, or "" (pure: no target is defined).
function(cohort_locate_torch_config out)
  cmake_parse_arguments(arg "" "" "HINTS" ${ARGN})
  set(candidates "")
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}")
  endif()
  set(arch_suffix "")
  if(CMAKE_LIBRARY_ARCHITECTURE)
    set(arch_suffix "lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch")
  endif()
  string(REPLACE ":" ";" env_prefixes "$ENV{CMAKE_PREFIX_PATH}")  # the environment form is colon-separated
  foreach(prefix IN LISTS CMAKE_PREFIX_PATH env_prefixes)
    foreach(suffix "" Torch share/cmake/Torch lib/cmake/Torch ${arch_suffix})
      list(APPEND candidates "${prefix}/${suffix}")
    endforeach()
  endforeach()
  foreach(hint IN LISTS arg_HINTS)
    list(APPEND candidates "${hint}")
    file(GLOB venv_torch LIST_DIRECTORIES true "${hint}/lib/python3*/site-packages/torch/share/cmake/Torch")
    list(APPEND candidates ${venv_torch})
  endforeach()
  foreach(prefix /usr /usr/local)
    list(APPEND candidates "${prefix}/${arch_suffix}" "${prefix}/lib/cmake/Torch" "${prefix}/share/cmake/Torch")
  endforeach()
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/TorchConfig.cmake")
      get_filename_component(dir "${dir}" ABSOLUTE)
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# The installation prefix of the LibTorch whose TorchConfig.cmake is in <dir> (Debian's lives under
# /usr, with its config in lib/<arch>/cmake/Torch).
function(cohort_torch_prefix dir out)
  get_filename_component(prefix "${dir}/../../.." ABSOLUTE)
  if(NOT EXISTS "${prefix}/include/torch/csrc/api/include/torch/version.h")
    get_filename_component(prefix "${dir}/../../../.." ABSOLUTE)
  endif()
  set(${out} "${prefix}" PARENT_SCOPE)
endfunction()

# Its version, major.minor.patch, from torch/version.h.
function(cohort_torch_version dir out)
  cohort_torch_prefix("${dir}" prefix)
  set(version "")
  foreach(h "${prefix}/include/torch/headeronly/version.h" "${prefix}/include/torch/csrc/api/include/torch/version.h")
    if(NOT version AND EXISTS "${h}")
      file(STRINGS "${h}" lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE "[^;]*_(MAJOR|MINOR|PATCH) +([0-9]+)" "\\2" parts "${lines}")
      list(JOIN parts "." version)
    endif()
  endforeach()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

function(cohort_find_torch)
  cmake_parse_arguments(arg "" "" "HINTS" ${ARGN})
  set(COHORT_TORCH_FOUND OFF PARENT_SCOPE)
  set(COHORT_TORCH_WITH_CUDA OFF PARENT_SCOPE)
  if(TARGET cohort::libtorch)  # a second find_package(cohort) in the same project
    get_target_property(dir cohort::libtorch COHORT_TORCH_DIR)
    get_target_property(version cohort::libtorch COHORT_TORCH_VERSION)
    get_target_property(cuda cohort::libtorch COHORT_TORCH_WITH_CUDA)
    set(COHORT_TORCH_FOUND ON PARENT_SCOPE)
    set(COHORT_TORCH_DIR "${dir}" PARENT_SCOPE)
    set(COHORT_TORCH_VERSION "${version}" PARENT_SCOPE)
    set(COHORT_TORCH_WITH_CUDA "${cuda}" PARENT_SCOPE)
    return()
  endif()
  cohort_locate_torch_config(dir HINTS ${arg_HINTS})
  if(NOT dir)
    return()
  endif()

  cohort_torch_prefix("${dir}" prefix)
  cohort_torch_version("${dir}" version)

  # CUDA: libtorch_cuda is there, and so are the libraries it needs (cuDNN stands for them: a
  # wheel's nvidia-cudnn package, or bundled in lib/ by the standalone LibTorch archive).
  set(lib "${prefix}/lib")
  file(GLOB wheel_cuda_dirs LIST_DIRECTORIES true "${prefix}/../nvidia/*/lib")
  set(with_cuda OFF)
  if(EXISTS "${lib}/libtorch_cuda.so")
    file(GLOB cudnn "${lib}/libcudnn.so*" "${prefix}/../nvidia/cudnn/lib/libcudnn.so*")
    if(COHORT_TORCH_CUDA STREQUAL "ON")
      set(with_cuda ON)
    elseif(COHORT_TORCH_CUDA STREQUAL "AUTO" AND cudnn)
      find_package(CUDAToolkit QUIET)
      if(CUDAToolkit_FOUND)
        set(with_cuda ON)
      endif()
    endif()
  endif()

  add_library(cohort::libtorch INTERFACE IMPORTED)
  set(runtime_first "")
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # The file itself, not -lstdc++: on Ubuntu 24.04 (GCC 13, binutils 2.42) -lstdc++ there left
    # the shared runtime out of the first places and std::filesystem in the executable.
    execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so.6 OUTPUT_VARIABLE runtime
                    OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND IS_ABSOLUTE "${runtime}" AND EXISTS "${runtime}")
      get_filename_component(runtime "${runtime}" ABSOLUTE)
    else()
      set(runtime "-lstdc++")
    endif()
    set(runtime_first "-Wl,--push-state,--no-as-needed,${runtime},--pop-state")
  endif()
  set_target_properties(cohort::libtorch PROPERTIES COHORT_TORCH_DIR "${dir}" COHORT_TORCH_VERSION "${version}"
                                                 COHORT_TORCH_WITH_CUDA ${with_cuda})
  if(NOT EXISTS "${lib}/libtorch_cuda.so" OR with_cuda)
    # TorchConfig.cmake looks for Caffe2Config.cmake in the default paths before its own folder,
    # so with Debian's libtorch-dev installed a wheel's TorchConfig would take Debian's targets.
    set(Torch_DIR "${dir}")
    if(EXISTS "${dir}/../Caffe2/Caffe2Config.cmake")
      get_filename_component(Caffe2_DIR "${dir}/../Caffe2" ABSOLUTE)
    endif()
    find_package(Torch CONFIG REQUIRED PATHS "${dir}" NO_DEFAULT_PATH)
    target_link_libraries(cohort::libtorch INTERFACE ${runtime_first} torch)
    foreach(d IN LISTS wheel_cuda_dirs)
      target_link_options(cohort::libtorch INTERFACE "LINKER:-rpath-link,${d}")
    endforeach()
  else()
    foreach(l torch_cpu c10)
      if(NOT EXISTS "${lib}/lib${l}.so")
        message(FATAL_ERROR "cohort: ${lib}/lib${l}.so not found: the LibTorch at ${dir} is incomplete; reinstall it (scripts/setup.sh does)")
      endif()
    endforeach()
    # Headers as TorchConfig.cmake gives them; the ABI flag where an older TorchConfig sets one.
    target_include_directories(cohort::libtorch SYSTEM INTERFACE "${prefix}/include" "${prefix}/include/torch/csrc/api/include")
    target_link_libraries(cohort::libtorch INTERFACE ${runtime_first} "${lib}/libtorch_cpu.so" "${lib}/libc10.so")
    target_compile_features(cohort::libtorch INTERFACE cxx_std_17)
    file(STRINGS "${dir}/TorchConfig.cmake" abi REGEX "_GLIBCXX_USE_CXX11_ABI=[01]")
    if(abi MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
      target_compile_definitions(cohort::libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${CMAKE_MATCH_1})
    endif()
  endif()
  # PyPI's wheels link parts of libstdc++ statically and export them (std::filesystem among them,
  # pytorch/pytorch#133437). Listed after libtorch, the C++ runtime loses to those copies for every
  # library in the process, and the 2.11 CUDA wheel's std::filesystem::remove_all calls address 0.
  # The runtime's file is named twice ahead of LibTorch, outside --as-needed: as an option (before
  # the objects, so ahead of every library) and as the first item of the library list, right
  # before LibTorch's libraries, where it holds whatever CMake does with options.
  # cohort/torch/runtime_binding.hpp warns at run time where neither took.
  if(runtime_first)
    target_link_options(cohort::libtorch INTERFACE "SHELL:${runtime_first}")
  endif()
  add_library(cohort::torch INTERFACE IMPORTED)
  target_link_libraries(cohort::torch INTERFACE cohort::cohort cohort::libtorch)
  target_compile_definitions(cohort::torch INTERFACE COHORT_WITH_TORCH=1)
  set(COHORT_TORCH_FOUND ON PARENT_SCOPE)
  set(COHORT_TORCH_DIR "${dir}" PARENT_SCOPE)
  set(COHORT_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(COHORT_TORCH_WITH_CUDA ${with_cuda} PARENT_SCOPE)
endfunction()
