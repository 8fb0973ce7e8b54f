#pragma once
/// \file
/// Trial schedulers (Ray Tune's FIFOScheduler, AsyncHyperBandScheduler, HyperBandScheduler,
/// MedianStoppingRule and PopulationBasedTraining): after every reported result they decide whether a trial proceeds,
/// stops, pauses or (PBT) exploits another trial. Each decision is a pure function of the results
/// seen so far (and, for PBT and multi-bracket ASHA, of a seeded std::mt19937_64 whose state is part
/// of `save_state`), so the tuner makes it on one rank and the tests check it on hand-computed
/// learning curves. None of them communicates.
///
/// A `result` is a JSON object with the user's metrics and the keys the tuner fills in:
/// `training_iteration` (1, 2, ...), `time_total_s`, `time_this_iter_s`, `timestamp`. A metric or
/// time attribute named "a/b" is looked up as that key, else as the path a -> b in nested objects
/// (Ray flattens results the same way).
///
/// Each scheduler may carry its own `metric`/`mode`; an empty `metric` (unset `mode`) takes the
/// tuner's `tuning::objective` given to `setup`.
///
/// One header per scheduler family, under tuning/schedule/; this header includes them all.

#include "cohort/tuning/schedule/asha.hpp"
#include "cohort/tuning/schedule/fifo.hpp"
#include "cohort/tuning/schedule/hyperband.hpp"
#include "cohort/tuning/schedule/median_stopping.hpp"
#include "cohort/tuning/schedule/pbt.hpp"
