/* Preloaded into the sanitizer runs of the MPI tests (tests/sanitizers/run.sh): keeps every
 * dlopen()ed library loaded. Open MPI unloads its components (mca_*.so) at MPI_Finalize, before
 * LeakSanitizer looks at the heap; their allocations then have no module to name, and no
 * suppression in lsan.supp can match them. Kept loaded, they are named and suppressed. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
