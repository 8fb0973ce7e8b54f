# cohort_find_shards()
# Finds libarchive (find_package(LibArchive)) and libjpeg-turbo's TurboJPEG library (turbojpeg.h,
# libturbojpeg) and, with both, defines the imported target cohort::shards: cohort::cohort (which
# must exist) plus both libraries, what a program reading or writing WebDataset tar shards
# (cohort/data/tar_shard.hpp, shard_set.hpp, shard_writer.hpp; cohort/data/torch/shard_dataset.hpp)
# or decoding JPEG (cohort/data/jpeg.hpp, cohort/data/torch/image.hpp) links. Sets COHORT_SHARDS_FOUND
# and, when not found, COHORT_SHARDS_MISSING (what is missing, for a message).
function(cohort_find_shards)
  set(COHORT_SHARDS_FOUND OFF PARENT_SCOPE)
  if(TARGET cohort::shards)  # a second find_package(cohort) in the same project
    set(COHORT_SHARDS_FOUND ON PARENT_SCOPE)
    return()
  endif()
  find_package(LibArchive QUIET)
  find_path(COHORT_TURBOJPEG_INCLUDE_DIR turbojpeg.h)
  find_library(COHORT_TURBOJPEG_LIBRARY turbojpeg)
  set(missing "")
  if(NOT LibArchive_FOUND)
    list(APPEND missing "libarchive (Debian: libarchive-dev)")
  endif()
  if(NOT COHORT_TURBOJPEG_INCLUDE_DIR OR NOT COHORT_TURBOJPEG_LIBRARY)
    list(APPEND missing "libjpeg-turbo's TurboJPEG (Debian: libturbojpeg0-dev)")
  endif()
  if(missing)
    list(JOIN missing " and " missing)
    set(COHORT_SHARDS_MISSING "${missing}" PARENT_SCOPE)
    return()
  endif()
  add_library(cohort::shards INTERFACE IMPORTED)
  target_link_libraries(cohort::shards INTERFACE cohort::cohort LibArchive::LibArchive "${COHORT_TURBOJPEG_LIBRARY}")
  target_include_directories(cohort::shards SYSTEM INTERFACE "${COHORT_TURBOJPEG_INCLUDE_DIR}")
  set(COHORT_SHARDS_FOUND ON PARENT_SCOPE)
endfunction()
