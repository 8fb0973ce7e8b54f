# cohort_find_mlflow()
# Finds libcurl (find_package(CURL)) and, with it, defines the imported target cohort::mlflow:
# cohort::cohort (which must exist) plus libcurl and COHORT_WITH_MLFLOW=1, what a program that logs
# to an MLflow tracking server (cohort/report/mlflow.hpp, which the umbrella header then includes)
# links. Sets COHORT_MLFLOW_FOUND and, when not found,
# COHORT_MLFLOW_MISSING (what is missing, for a message).
function(cohort_find_mlflow)
  set(COHORT_MLFLOW_FOUND OFF PARENT_SCOPE)
  if(TARGET cohort::mlflow)  # a second find_package(cohort) in the same project
    set(COHORT_MLFLOW_FOUND ON PARENT_SCOPE)
    return()
  endif()
  find_package(CURL QUIET)
  if(NOT CURL_FOUND)
    set(COHORT_MLFLOW_MISSING "libcurl (Debian: libcurl4-openssl-dev)" PARENT_SCOPE)
    return()
  endif()
  add_library(cohort::mlflow INTERFACE IMPORTED)
  target_link_libraries(cohort::mlflow INTERFACE cohort::cohort CURL::libcurl)
  target_compile_definitions(cohort::mlflow INTERFACE COHORT_WITH_MLFLOW=1)
  set(COHORT_MLFLOW_FOUND ON PARENT_SCOPE)
endfunction()
