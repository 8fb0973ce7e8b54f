#pragma once
/// \file
/// Forward declarations of cohort's main types.

namespace cohort {
class environment;
class context;
struct run_config;
struct device;
struct model_options;
struct loader_options;
struct loader_state;
struct datasets;
struct tensor_dataset;
template <class Return>
struct result;
template <class Fn, class... Policies>
class trainer;
template <class Module>
class prepared_model;
namespace comm {
class mpi;
class any;
}  // namespace comm
}  // namespace cohort
