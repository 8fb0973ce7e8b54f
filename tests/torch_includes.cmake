# cmake -DDIR=include/cohort -P torch_includes.cmake: every header in a torch/ folder under DIR
# (torch/, data/torch/) that names LibTorch (torch::, at::, c10::) includes a LibTorch header
# itself (<torch/...>, <ATen/...>, <c10/...>) or a cohort header of a torch/ folder that does: what
# cohort_header_check cannot see for these headers, which it compiles with LibTorch's header
# precompiled.
file(GLOB_RECURSE headers ${DIR}/*.hpp)
list(FILTER headers INCLUDE REGEX "/torch/[^/]+\\.hpp$")
set(bad "")
foreach(h IN LISTS headers)
  file(READ ${h} text)
  if(NOT text MATCHES "[^a-zA-Z0-9_:](torch|at|c10)::")
    continue()
  endif()
  if(NOT text MATCHES "#include <(torch|ATen|c10)/" AND NOT text MATCHES "#include \"cohort/(data/)?torch/")
    get_filename_component(name ${h} NAME)
    list(APPEND bad ${name})
  endif()
endforeach()
list(LENGTH headers n)
if(bad)
  message(FATAL_ERROR "these headers use LibTorch and include none of its headers: ${bad}")
endif()
message("ok: ${n} headers in the torch/ folders of ${DIR} include what LibTorch they use")
