#pragma once
/// \file
/// The umbrella header: everything, with the LibTorch integration when COHORT_WITH_TORCH is set
/// (the cohort::cohort CMake target sets it when Torch was found) and the NCCL backend when
/// COHORT_WITH_NCCL is set (link cohort::nccl), and report::mlflow when COHORT_WITH_MLFLOW is set
/// (link cohort::mlflow: libcurl).

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/checkpointing/policies.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/concepts.hpp"
#include "cohort/context.hpp"
#include "cohort/data/csv.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/data/record_file.hpp"
#include "cohort/environment.hpp"
#include "cohort/error.hpp"
#include "cohort/fwd.hpp"
#include "cohort/gradients/bucket_plan.hpp"
#include "cohort/gradients/model_options.hpp"
#include "cohort/report/console.hpp"
#include "cohort/report/flatten.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/result.hpp"
#include "cohort/run_config.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cuda.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"
#include "cohort/data/batch_size.hpp"
#include "cohort/data/datasets.hpp"
#include "cohort/data/loader_options.hpp"
#include "cohort/sharding/policies.hpp"
#include "cohort/sharding/redeal.hpp"
#include "cohort/sharding/views.hpp"
#include "cohort/trainer.hpp"

#if COHORT_WITH_NCCL
#include "cohort/comm/nccl.hpp"
#endif

#if COHORT_WITH_MLFLOW
#include "cohort/report/mlflow.hpp"
#endif

#if COHORT_WITH_TORCH
#include "cohort/torch/autocast.hpp"
#include "cohort/torch/checkpoint_state.hpp"
#include "cohort/data/torch/data_loader.hpp"
#include "cohort/torch/grad_scaler.hpp"
#include "cohort/torch/prepare_model.hpp"
#include "cohort/torch/threads.hpp"
#include "cohort/torch/to_torch.hpp"
#endif
