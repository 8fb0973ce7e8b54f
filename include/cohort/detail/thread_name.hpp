#pragma once
/// \file
/// Names cohort's background threads, so that `top -H`, `ps -L`, `perf` and debuggers tell the
/// checkpoint writer from the training thread (all of a process's threads otherwise carry the
/// program's name).

#include <pthread.h>

namespace cohort::detail {

/// Names the calling thread: at most 15 characters (Linux refuses a longer name, and the thread
/// keeps the program's). Best effort.
inline void name_this_thread(char const* name) {
#ifdef __linux__
  (void)pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

}  // namespace cohort::detail
