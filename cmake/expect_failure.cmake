# cmake -DCOMMAND="a;b;c" -DEXPECT="regex1;regex2" -P expect_failure.cmake
# Passes when COMMAND exits non-zero and its output matches every EXPECT regex (used to check that
# bad input gives a clear error on every rank and a non-zero exit).
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
set(all "${out}${err}")
message("${all}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "output does not match: ${re}")
  endif()
endforeach()
