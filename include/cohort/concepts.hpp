#pragma once
/// \file
/// One concept per policy axis of the trainer, each beside the policies it checks:
/// `cohort::scaling_policy` (scaling/policy.hpp), `cohort::sharding_policy`
/// (sharding/policies.hpp) and `cohort::checkpointing_policy` (checkpointing/policies.hpp); the
/// tuning axis's (searcher, scheduler, stopper) are in tuning/concepts.hpp. Every policy cohort
/// ships is checked against its concept with a static_assert beside it; a user's policy that
/// breaks one is a compile error naming the concept. This header gathers the three with the
/// policies cohort ships.

#include "cohort/checkpointing/policies.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cuda.hpp"
#include "cohort/scaling/policy.hpp"
#include "cohort/sharding/policies.hpp"
