# cohort_add_mpi_test(<name> <target> [RANKS <n>...] [ARGS <arg>...] [LABELS <label>...]
#                     [LAUNCHER <command>...])
# Registers <name>.<n>ranks for each rank count (1-4 by default), run through MPIEXEC_EXECUTABLE with
# MPIEXEC_NUMPROC_FLAG and MPIEXEC_PREFLAGS; --oversubscribe is added for Open MPI only. Each test
# claims its rank count of PROCESSORS and has 180 s. With LAUNCHER, ctest runs that command with the
# whole mpirun line as its last arguments, and the command decides the outcome (tests/expect.sh).
# Running as root (CI containers) is allowed through Open MPI's environment variables here, never
# inside the library.
# COHORT_MPI_OVERSUBSCRIBE: --oversubscribe for Open MPI (more ranks than cores in tests), else empty.
set(COHORT_MPI_OVERSUBSCRIBE "")
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE cohort_mpi_version ERROR_QUIET)
if(cohort_mpi_version MATCHES "Open MPI|OpenRTE")
  set(COHORT_MPI_OVERSUBSCRIBE --oversubscribe)
endif()
# Environment of every multi-rank test: Open MPI may run as root (CI containers) and oversubscribe.
set(COHORT_MPI_TEST_ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")

function(cohort_add_mpi_test name target)
  cmake_parse_arguments(arg "" "" "RANKS;ARGS;LABELS;LAUNCHER" ${ARGN})
  if(NOT arg_RANKS)
    set(arg_RANKS 1 2 3 4)
  endif()
  set(extra ${COHORT_MPI_OVERSUBSCRIBE})
  foreach(n IN LISTS arg_RANKS)
    add_test(NAME ${name}.${n}ranks
             COMMAND ${arg_LAUNCHER} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${extra} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    set_tests_properties(${name}.${n}ranks PROPERTIES
      ENVIRONMENT "${COHORT_MPI_TEST_ENVIRONMENT}"
      PROCESSORS ${n} TIMEOUT 180 LABELS "mpi;${arg_LABELS}")
  endforeach()
endfunction()
