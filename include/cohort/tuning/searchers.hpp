#pragma once
/// \file
/// Searchers: the policies that propose trial configs from a search space (cohort::searcher).
/// `search::basic` is Ray Tune's default (BasicVariantGenerator: grid expansion plus independent
/// random draws); `search::tpe` is a built-in Tree-structured Parzen Estimator (Bergstra et al.
/// 2011, as Optuna's independent TPESampler runs it). Every searcher is deterministic for a seed,
/// and its JSON state restores it exactly, so a resumed experiment proposes what the interrupted
/// one would have.
/// `search::bohb` drives schedule::hyperband's brackets with one such model per budget.
///
/// One header per searcher under tuning/search/ (namespace cohort::tuning::search, also named
/// cohort::search); this header includes them all.

#include "cohort/tuning/search/basic.hpp"
#include "cohort/tuning/search/bohb.hpp"
#include "cohort/tuning/search/tpe.hpp"
