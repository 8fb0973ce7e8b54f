// Projected step time, exposed communication and scaling efficiency of data-parallel training on
// 8 to 1024 H100s (8 per node), from the scaling model (cohort/scaling/projection.hpp,
// docs/scaling-model.md), for three reference models (the MLPs of bench/gpu_step.cpp and a
// GPT-style decoder). Pure arithmetic: no MPI run, no GPU, no Google Benchmark.
//   ./bench_scaling_model [--mlp-large-step-ms 2.7] [--mlp-large-backward-share 0.52] ...   (--help)
// Prints, per model, a Markdown table and one JSON line. The single-GPU figures are calibration
// inputs: until they are measured on the GPU machine and passed as flags, the defaults are
// estimates, and the output says so on every line that uses them.
#include <cohort/scaling/projection.hpp>
#include <cohort/gradients/bucket_plan.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace scaling = cohort::scaling;

constexpr std::array<int, 8> gpu_counts{8, 16, 32, 64, 128, 256, 512, 1024};

// Peak and measured rates behind the estimates (docs/scaling-model.md cites them).
constexpr double h100_fp32_vector_tflops = 66.9;   // H100 SXM, FP32 without tensor cores
constexpr double h100_bf16_measured_tflops = 800;  // bf16 matmuls on the GPU machine (shared/gpu/README.md)
constexpr double hbm_traffic_tbytes_per_s = 3.0;   // device copy rate on the GPU machine

/// One benchmark model: its gradient tensors and how its single-GPU step was estimated.
struct model {
  std::string key;          // flag prefix and JSON name
  std::string description;
  std::vector<cohort::tensor_spec> tensors{};  // registration order
  std::size_t params = 0;
  std::string dtype;
  // Calibration: the estimate and the words that say where it comes from.
  double step_ms = 0;
  double backward_share = 0;
  double optimizer_share = 0;
  std::string estimate_note{};
  std::string source = "estimate, not measured";
  std::vector<std::string> given{};  // calibration inputs given on the command line
};

void add_tensor(model& m, std::size_t numel, std::size_t bytes_per_element) {
  m.tensors.push_back({numel * bytes_per_element, 0});
  m.params += numel;
}

void add_linear(model& m, std::size_t in, std::size_t out, std::size_t bytes_per_element) {
  add_tensor(m, in * out, bytes_per_element);
  add_tensor(m, out, bytes_per_element);
}

std::string fmt(char const* format, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c);
  return buf;
}

// A compute-bound step: 6 * params * samples FLOPs (forward 2, backward 4) at `tflops`, then an
// optimizer moving `optimizer_bytes_per_param` bytes per parameter through HBM.
void estimate_from_flops(model& m, double samples, double tflops, double optimizer_bytes_per_param) {
  double flop = 6.0 * static_cast<double>(m.params) * samples;
  double compute_ms = flop / (tflops * 1e12) * 1e3;
  double optimizer_ms = optimizer_bytes_per_param * static_cast<double>(m.params) / (hbm_traffic_tbytes_per_s * 1e12) * 1e3;
  m.step_ms = compute_ms + optimizer_ms;
  m.backward_share = compute_ms * 2.0 / 3.0 / m.step_ms;
  m.optimizer_share = optimizer_ms / m.step_ms;
  m.estimate_note = std::string("6 x ") + fmt("%.2fM params x %.0f", static_cast<double>(m.params) / 1e6, samples) +
                    (m.key == "transformer" ? " tokens" : " samples") + fmt(" = %.1f GFLOP at %.0f TFLOP/s", flop / 1e9, tflops) +
                    fmt(" (%.2f ms) + optimizer %.0f B/param at %.0f TB/s", compute_ms, optimizer_bytes_per_param,
                        hbm_traffic_tbytes_per_s) +
                    fmt(" (%.2f ms)", optimizer_ms);
}

std::vector<model> benchmark_models() {
  std::vector<model> models;
  {
    model m{.key = "mlp-large", .description = "MLP 1024-4x4096-10, batch 256, fp32", .dtype = "fp32"};
    add_linear(m, 1024, 4096, 4);
    for (int i = 0; i < 3; ++i) add_linear(m, 4096, 4096, 4);
    add_linear(m, 4096, 10, 4);
    // LibTorch's fp32 matmuls do not use TF32 unless asked (float32 matmul precision "highest"),
    // so the FP32 vector peak applies: 60% of it. SGD with momentum, LibTorch's per-parameter
    // loop (bench/train_step.cpp): mul_, add_, add_ = 8 fp32 accesses = 32 B per parameter.
    estimate_from_flops(m, 256, 0.6 * h100_fp32_vector_tflops, 32);
    m.estimate_note += "; fp32 without TF32 (LibTorch's default) at 60% of the H100's 66.9 TFLOP/s FP32 peak; SGD with momentum";
    models.push_back(std::move(m));
  }
  {
    model m{.key = "mlp-small", .description = "MLP 1024-256-256-10, batch 64, fp32", .dtype = "fp32"};
    add_linear(m, 1024, 256, 4);
    add_linear(m, 256, 256, 4);
    add_linear(m, 256, 10, 4);
    // The reference: a plain C++ LibTorch loop ran this model at about 0.75 ms per step on an H100.
    // The step is launch-bound (127 MFLOP), so the shares are guessed from operator counts:
    // about 7 in forward, 15 in backward, 18 in the SGD-with-momentum step.
    m.step_ms = 0.75;
    m.backward_share = 0.45;
    m.optimizer_share = 0.30;
    m.source = "reference figure and estimates, not measured";
    m.estimate_note = "0.75 ms/step: the reference figure for a plain C++ LibTorch loop on an H100; backward 45% and "
                      "optimizer 30% guessed from operator counts (a launch-bound step)";
    models.push_back(std::move(m));
  }
  {
    // A GPT-style decoder of ~100M parameters: d_model 768, 12 layers, FFN 3072, vocabulary 16384,
    // context 256, learned positions, LM head tied to the token embedding; bf16 parameters and
    // gradients.
    model m{.key = "transformer", .description = "GPT-style decoder, ~100M params (d 768, 12 layers, vocab 16384), batch 16 x 256 tokens, bf16",
            .dtype = "bf16"};
    std::size_t const d = 768, vocab = 16384, context = 256, layers = 12;
    add_tensor(m, vocab * d, 2);
    add_tensor(m, context * d, 2);
    for (std::size_t l = 0; l < layers; ++l) {
      add_tensor(m, d, 2);  // layer norm 1
      add_tensor(m, d, 2);
      add_linear(m, d, 3 * d, 2);  // q, k, v
      add_linear(m, d, d, 2);      // attention output
      add_tensor(m, d, 2);         // layer norm 2
      add_tensor(m, d, 2);
      add_linear(m, d, 4 * d, 2);
      add_linear(m, 4 * d, d, 2);
    }
    add_tensor(m, d, 2);  // final layer norm
    add_tensor(m, d, 2);
    // 40% of the bf16 matmul rate measured on the GPU machine: d=768 GEMMs, unfused attention and
    // element-wise kernels in an eager LibTorch loop. AdamW, LibTorch's per-parameter loop on bf16
    // tensors: about 23 two-byte accesses per parameter.
    estimate_from_flops(m, 16.0 * 256, 0.4 * h100_bf16_measured_tflops, 46);
    m.estimate_note += "; bf16 at 40% of the 800 TFLOP/s bf16 matmul rate measured on the GPU machine; AdamW; "
                       "attention's quadratic FLOPs (~2%) left out";
    models.push_back(std::move(m));
  }
  return models;
}

// Rounded to `decimals` places, so that the JSON shows them and no binary noise.
double rounded(double x, int decimals) {
  double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

int usage(char const* program, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s [options]\n"
               "calibration (per model: mlp-large, mlp-small, transformer; defaults are estimates):\n"
               "  --<model>-step-ms MS            single-GPU step without communication\n"
               "  --<model>-backward-share F      share of the step spent in backward\n"
               "  --<model>-optimizer-share F     share of the step after backward (optimizer)\n"
               "  --per-bucket-overhead-us US     reducer cost per bucket all-reduce (default 5, estimate)\n"
               "cluster (defaults: docs/scaling-model.md):\n"
               "  --nvlink-busbw GBPS             all-reduce bus bandwidth within a node (370)\n"
               "  --network-busbw GBPS            bus bandwidth per GPU across nodes (45)\n"
               "  --gpus-per-node N               (8)\n"
               "buckets:\n"
               "  --bucket-cap-mib N              (25, prepare_model's default)\n"
               "  --first-bucket-cap-mib N        (1)\n",
               program);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  auto models = benchmark_models();
  scaling::cluster cluster;
  cohort::model_options buckets_options;
  double per_bucket_overhead_us = 5;
  bool overhead_given = false;

  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage(argv[0], 0);
    if (i + 1 >= argc) return usage(argv[0], 2);
    char* end = nullptr;
    double value = std::strtod(argv[i + 1], &end);
    if (end == argv[i + 1] || *end != '\0' || !(value >= 0)) {
      std::fprintf(stderr, "%s: %s needs a non-negative number, not '%s'\n", argv[0], flag.c_str(), argv[i + 1]);
      return 2;
    }
    ++i;
    bool known = true;
    if (flag == "--per-bucket-overhead-us") {
      per_bucket_overhead_us = value;
      overhead_given = true;
    } else if (flag == "--nvlink-busbw") {
      cluster.intra_node.bus_bandwidth_gbytes_per_s = value;
    } else if (flag == "--network-busbw") {
      cluster.inter_node.bus_bandwidth_gbytes_per_s = value;
    } else if (flag == "--gpus-per-node") {
      cluster.gpus_per_node = static_cast<int>(value);
    } else if (flag == "--bucket-cap-mib") {
      buckets_options.bucket_cap_bytes = static_cast<std::size_t>(value * (1 << 20));
    } else if (flag == "--first-bucket-cap-mib") {
      buckets_options.first_bucket_cap_bytes = static_cast<std::size_t>(value * (1 << 20));
    } else {
      known = false;
      for (auto& m : models) {
        std::string p = "--" + m.key + "-";
        if (flag.rfind(p, 0) != 0) continue;
        std::string what = flag.substr(p.size());
        if (what == "step-ms") m.step_ms = value;
        else if (what == "backward-share") m.backward_share = value;
        else if (what == "optimizer-share") m.optimizer_share = value;
        else continue;
        known = true;
        m.given.push_back(what);
      }
    }
    if (!known) {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], flag.c_str());
      return usage(argv[0], 2);
    }
  }
  for (auto const& m : models)
    if (m.step_ms <= 0 || m.backward_share + m.optimizer_share > 1) {
      std::fprintf(stderr, "%s: %s: the step must be positive and backward + optimizer shares at most 1\n", argv[0], m.key.c_str());
      return 2;
    }
  if (cluster.gpus_per_node < 1 || cluster.intra_node.bus_bandwidth_gbytes_per_s <= 0 ||
      cluster.inter_node.bus_bandwidth_gbytes_per_s <= 0) {
    std::fprintf(stderr, "%s: gpus per node and bandwidths must be positive\n", argv[0]);
    return 2;
  }

  std::printf("# Scaling model: projected data-parallel step on H100 nodes\n\n");
  std::printf("cluster: %s\n", scaling::to_string(cluster).c_str());
  std::printf("buckets: cap %.0f MiB, first bucket %.0f MiB (prepare_model's plan); per-bucket overhead %.1f us (%s)\n",
              static_cast<double>(buckets_options.bucket_cap_bytes) / (1 << 20),
              static_cast<double>(buckets_options.first_bucket_cap_bytes) / (1 << 20), per_bucket_overhead_us,
              overhead_given ? "given" : "estimate, not measured");
  std::printf("weak scaling: fixed batch per GPU; efficiency = single-GPU step / projected step\n");

  for (auto const& m : models) {
    std::vector<std::size_t> buckets;
    std::size_t gradient_bytes = 0;
    for (auto const& b : cohort::plan_buckets(m.tensors, buckets_options)) {
      buckets.push_back(b.bytes);
      gradient_bytes += b.bytes;
    }
    scaling::step_profile profile{.step_us = m.step_ms * 1e3,
                                  .backward_fraction = m.backward_share,
                                  .optimizer_fraction = m.optimizer_share,
                                  .per_bucket_overhead_us = per_bucket_overhead_us};
    auto rows = scaling::project_scaling(buckets, profile, cluster, gpu_counts);

    // What the calibration rests on: every input given, or which estimates are still in use.
    std::string source = m.source;
    if (m.given.size() == 3) source = "given on the command line";
    else if (!m.given.empty()) source = "partly given on the command line, partly " + m.source;
    std::printf("\n## %s: %s\n\n", m.key.c_str(), m.description.c_str());
    std::printf("%.2fM parameters, %.1f MB of %s gradients in %zu buckets\n", static_cast<double>(m.params) / 1e6,
                static_cast<double>(gradient_bytes) / 1e6, m.dtype.c_str(), buckets.size());
    std::printf("single-GPU step %.3f ms, backward %.0f%%, optimizer %.0f%%: ", m.step_ms, m.backward_share * 100,
                m.optimizer_share * 100);
    if (m.given.size() == 3) {
      std::printf("given on the command line\n");
    } else {
      std::string given;
      for (auto const& g : m.given) given += (given.empty() ? "" : ", ") + g;
      std::printf("%s: %s%s\n", m.source == "estimate, not measured" ? "ESTIMATE, NOT MEASURED" : "REFERENCE FIGURE AND ESTIMATES, NOT MEASURED",
                  m.estimate_note.c_str(), given.empty() ? "" : ("; given on the command line: " + given).c_str());
    }
    std::printf("\n| GPUs | nodes | all-reduce total (ms) | exposed comm (ms) | step (ms) | efficiency |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
    nlohmann::ordered_json projection = nlohmann::ordered_json::array();
    for (auto const& r : rows) {
      std::printf("| %d | %d | %.3f | %.3f | %.3f | %.1f%% |\n", r.gpus, r.nodes, r.communication_us / 1e3,
                  r.exposed_communication_us / 1e3, r.step_us / 1e3, r.efficiency * 100);
      projection.push_back({{"gpus", r.gpus},
                            {"nodes", r.nodes},
                            {"allreduce_ms", rounded(r.communication_us / 1e3, 4)},
                            {"exposed_comm_ms", rounded(r.exposed_communication_us / 1e3, 4)},
                            {"step_ms", rounded(r.step_us / 1e3, 4)},
                            {"efficiency", rounded(r.efficiency, 4)}});
    }
    nlohmann::ordered_json line{{"model", m.key},
                        {"params", m.params},
                        {"gradient_bytes", gradient_bytes},
                        {"buckets", buckets.size()},
                        {"calibration", source},
                        {"single_gpu_step_ms", rounded(m.step_ms, 4)},
                        {"backward_share", rounded(m.backward_share, 4)},
                        {"optimizer_share", rounded(m.optimizer_share, 4)},
                        {"per_bucket_overhead_us", per_bucket_overhead_us},
                        {"projection", projection}};
    std::printf("\n%s\n", line.dump().c_str());
  }
  return 0;
}
