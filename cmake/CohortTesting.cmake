# cohort_add_mpi_test(<name> <target> RANKS <n>... [ARGS <arg>...])
# Registers <name>.<n>ranks for each rank count, run through MPIEXEC_EXECUTABLE with
# MPIEXEC_NUMPROC_FLAG and MPIEXEC_PREFLAGS; --oversubscribe is added for Open MPI only.
# Running as root (CI containers) is allowed through Open MPI's environment variables here, never
# inside the library.
function(cohort_add_mpi_test name target)
  cmake_parse_arguments(arg "" "" "RANKS;ARGS;LABELS" ${ARGN})
  if(NOT arg_RANKS)
    set(arg_RANKS 1 2 3 4)
  endif()
  set(extra "")
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE version ERROR_QUIET)
  if(version MATCHES "Open MPI|OpenRTE")
    set(extra --oversubscribe)
  endif()
  foreach(n IN LISTS arg_RANKS)
    add_test(NAME ${name}.${n}ranks
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${extra} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    set_tests_properties(${name}.${n}ranks PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
      PROCESSORS ${n} TIMEOUT 180 LABELS "mpi;${arg_LABELS}")
  endforeach()
endfunction()
