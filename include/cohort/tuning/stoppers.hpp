#pragma once
/// \file
/// Stop criteria (Ray Tune's `stop` dict, FunctionStopper, TrialPlateauStopper, TimeoutStopper,
/// MaximumIterationStopper): `stop_trial` ends one trial after one of its results, `stop_all` ends
/// the whole experiment. The tuner asks every stopper it was given and stops when any says so.
/// Each is a pure function of the results it was shown (and the elapsed time it is told); none
/// communicates. A key named "a/b" is looked up as that key, else as the path a -> b in nested
/// objects (Ray flattens results the same way). Knobs are checked on every call, so a bad one
/// throws cohort::error the first time the stopper is used.
///
/// One header per stopper under tuning/stop/ (namespace cohort::tuning::stop, also named
/// cohort::stop); this header includes them all.

#include "cohort/tuning/stop/function.hpp"
#include "cohort/tuning/stop/maximum_iterations.hpp"
#include "cohort/tuning/stop/plateau.hpp"
#include "cohort/tuning/stop/thresholds.hpp"
#include "cohort/tuning/stop/time_budget.hpp"
