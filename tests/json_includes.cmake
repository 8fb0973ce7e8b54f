# cmake -DDIR=include/cohort -P json_includes.cmake: every header under DIR that names nlohmann::
# includes <nlohmann/json.hpp> (or <nlohmann/json_fwd.hpp>) itself: what cohort_header_check cannot
# see for the headers it compiles with nlohmann/json precompiled (those that include it through
# another cohort header).
file(GLOB_RECURSE headers RELATIVE ${DIR} ${DIR}/*.hpp)
set(bad "")
foreach(h IN LISTS headers)
  file(READ ${DIR}/${h} text)
  if(text MATCHES "nlohmann::" AND NOT text MATCHES "#include <nlohmann/json(_fwd)?\\.hpp>")
    list(APPEND bad ${h})
  endif()
endforeach()
list(LENGTH headers n)
if(bad)
  message(FATAL_ERROR "these headers name nlohmann:: and do not include <nlohmann/json.hpp>: ${bad}")
endif()
message("ok: the headers of ${DIR} (${n}) that name nlohmann:: include <nlohmann/json.hpp>")
