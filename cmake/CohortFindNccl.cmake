# cohort_find_nccl()
# Finds the CUDA runtime (find_package(CUDAToolkit)), nccl.h and libnccl (hints: /usr/local/cuda,
# $CUDA_HOME) and, with all three, defines the imported target cohort::nccl: cohort::cohort (which
# must exist) plus CUDA::cudart, NCCL and COHORT_WITH_NCCL=1, what a program using comm::nccl or
# scaling::cuda's NCCL path links. Nothing here needs a GPU. Sets COHORT_NCCL_FOUND and, when not
# found, COHORT_NCCL_MISSING (what is missing, for a message); COHORT_CUDA_VERSION when found.
function(cohort_find_nccl)
  set(COHORT_NCCL_FOUND OFF PARENT_SCOPE)
  if(TARGET cohort::nccl)  # a second find_package(cohort) in the same project
    set(COHORT_NCCL_FOUND ON PARENT_SCOPE)
    return()
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(COHORT_NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ENV CUDA_HOME PATH_SUFFIXES include)
  find_library(COHORT_NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ENV CUDA_HOME PATH_SUFFIXES lib64 lib)
  set(missing "")
  if(NOT CUDAToolkit_FOUND)
    list(APPEND missing "the CUDA runtime (find_package(CUDAToolkit))")
  endif()
  if(NOT COHORT_NCCL_INCLUDE_DIR OR NOT COHORT_NCCL_LIBRARY)
    list(APPEND missing "NCCL (nccl.h and libnccl)")
  endif()
  if(missing)
    list(JOIN missing " and " missing)
    set(COHORT_NCCL_MISSING "${missing}" PARENT_SCOPE)
    return()
  endif()
  add_library(cohort::nccl INTERFACE IMPORTED)
  target_link_libraries(cohort::nccl INTERFACE cohort::cohort CUDA::cudart "${COHORT_NCCL_LIBRARY}")
  target_include_directories(cohort::nccl SYSTEM INTERFACE "${COHORT_NCCL_INCLUDE_DIR}")
  target_compile_definitions(cohort::nccl INTERFACE COHORT_WITH_NCCL=1)
  set(COHORT_NCCL_FOUND ON PARENT_SCOPE)
  set(COHORT_CUDA_VERSION "${CUDAToolkit_VERSION}" PARENT_SCOPE)
endfunction()
