#pragma once
/// \file
/// What each of cohort's background threads does first: take its name, so that `top -H`,
/// `ps -L`, `perf` and debuggers tell it from the training thread (all of a process's threads
/// otherwise carry the program's name), and move to the node's spare cores (scaling/cpu_set.hpp).

#include <pthread.h>

#include "cohort/scaling/cpu_set.hpp"

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

/// Called first by every cohort background thread (checkpoint writer and progress lines,
/// validation, deletion, data loader producer, all-reduce thread, tuner coordinator): names it
/// `name` and moves it to the node's spare cores, if there are any.
inline void begin_background_thread(char const* name) {
  name_this_thread(name);
  scaling::move_to_spare_cpus();
}

}  // namespace cohort::detail
