// Decoded samples per second of cohort's loader over WebDataset tar shards of JPEG images, and its
// resident memory; bench/compare/shard_loader_run sets it beside PyTorch's DataLoader with
// webdataset over the same shards.
//   ./bench_shard_loader make --out DIR --gb G [--side 224] [--distinct 512] [--samples-per-shard 1000]
//       a synthetic image set: side x side RGB JPEGs (quality 90) of `distinct` smooth random
//       pictures, written again and again under new keys until the shards hold G GB, with labels
//   ./bench_shard_loader read --shards DIR [--workers K] [--samples N] [--batch 64] [--buffer 0]
//                             [--channels 3] [--pattern "images-*.tar"] [--device cpu|cuda]
//       one rank reads N samples (0: the whole epoch) in batches, decoding each JPEG into a uint8
//       tensor of channels x side x side on K threads; prints one JSON line: samples_per_s (after
//       the first 2 batches), max_rss_mb (VmHWM: the loader's peak resident memory). With
//       --device cuda each batch is pinned and copied to GPU 0 (non-blocking), as a GPU rank's is.
//   ./bench_shard_loader --smoke
//       both, on a tiny set in a temporary folder (CI keeps the program from rotting)
#include <cohort/cohort.hpp>
#include <cohort/data/jpeg.hpp>
#include <cohort/data/shard_writer.hpp>
#include <cohort/data/torch/image.hpp>
#include <cohort/data/torch/shard_dataset.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>

namespace {

std::map<std::string, std::string> flags(int argc, char** argv, int from) {
  std::map<std::string, std::string> f;
  for (int i = from; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

double max_rss_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

/// A smooth random picture (sums of a few sines per channel): compresses like a photo, not like noise.
std::vector<std::uint8_t> picture(int side, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(side) * side * 3);
  double f[3][4];
  for (auto& c : f)
    for (auto& v : c) v = u(gen);
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x)
      for (int c = 0; c < 3; ++c) {
        double v = 128 + 60 * std::sin(x * f[c][0] * 0.1 + y * f[c][1] * 0.07) + 40 * std::cos((x + y) * f[c][2] * 0.05 + f[c][3] * 6) +
                   20 * (u(gen) - 0.5);
        px[(static_cast<std::size_t>(y) * side + x) * 3 + c] = static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return px;
}

int make(std::map<std::string, std::string> f) {
  auto const out = f.at("--out");
  double const gb = std::stod(f.at("--gb"));
  int const side = std::stoi(f.count("--side") ? f["--side"] : "224");
  std::size_t const distinct = std::stoul(f.count("--distinct") ? f["--distinct"] : "512");
  std::size_t const per = std::stoul(f.count("--samples-per-shard") ? f["--samples-per-shard"] : "1000");
  std::mt19937 gen(1);
  std::vector<std::vector<std::byte>> jpgs;
  for (std::size_t i = 0; i < distinct; ++i) jpgs.push_back(cohort::data::encode_jpeg(picture(side, gen), {side, side, 3}, 90));
  cohort::data::shard_writer w(out, {.prefix = "images", .samples_per_shard = per});
  double bytes = 0;
  std::size_t n = 0;
  for (; bytes < gb * 1e9; ++n) {
    auto const& jpg = jpgs[n % distinct];
    auto cls = std::to_string(n % 1000);
    char key[24];
    std::snprintf(key, sizeof key, "%08zu", n);
    w.write(key, {{"jpg", jpg}, {"cls", std::as_bytes(std::span(cls.data(), cls.size()))}});
    bytes += static_cast<double>(jpg.size() + 2048);
  }
  auto set = w.close();
  std::cout << nlohmann::json{{"samples", n}, {"shards", set.shards.size()}, {"gb", bytes / 1e9}, {"side", side}}.dump() << "\n";
  return 0;
}

int channels = 3;  ///< read's --channels: 3 for the synthetic RGB sets, 1 for Fashion-MNIST's shards

torch::data::Example<> image_sample(cohort::data::sample const& s) {
  return {cohort::decode_jpeg(s.member("jpg"), {.channels = channels}),
          torch::tensor(static_cast<std::int64_t>(std::stoi(s.text("cls"))))};
}

int read(std::map<std::string, std::string> f) {
  auto const dir = f.at("--shards");
  std::size_t const workers = std::stoul(f.count("--workers") ? f["--workers"] : "1");
  std::int64_t const want = std::stoll(f.count("--samples") ? f["--samples"] : "0");
  std::int64_t const batch = std::stoll(f.count("--batch") ? f["--batch"] : "64");
  std::size_t const buffer = std::stoul(f.count("--buffer") ? f["--buffer"] : "0");
  channels = std::stoi(f.count("--channels") ? f["--channels"] : "3");
  auto const on = f.count("--device") ? f["--device"] : "cpu";
  if (on != "cpu" && on != "cuda") throw cohort::error("--device " + on + ": use cpu or cuda");
  auto const device = on == "cuda" ? cohort::device{.kind = cohort::device_kind::cuda, .index = 0} : cohort::device{};
  auto const pattern = f.count("--pattern") ? f["--pattern"] : "images-*.tar";
  cohort::shard_dataset d{.shards = cohort::data::shard_set::from_glob(dir + "/" + pattern),
                          .transform = image_sample,
                          .sharding = {.shuffle_shards = false, .shuffle_buffer_samples = buffer}};
  auto stream = d.as_stream();
  auto dealing = *stream.impl->dealing();
  cohort::data_loader<cohort::stream_dataset> loader(
      stream, cohort::sharding::rank_shard{dealing.first, 1, 0},
      {.batch_size = batch, .prefetch_batches = 2 * workers, .num_workers = workers, .drop_last = false}, device, dealing.second);
  std::int64_t samples = 0, timed = 0, batches = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::int64_t checksum = 0;
  for (auto& b : loader.epoch()) {
    checksum += b.targets.sum().item<std::int64_t>();
    samples += b.targets.size(0);
    if (++batches == 2) {  // the threads started and the first files opened
      t0 = std::chrono::steady_clock::now();
      timed = samples;
    }
    if (want > 0 && samples >= want) break;
  }
  double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << nlohmann::json{{"loader", "cohort"},       {"workers", workers}, {"device", device.str()},
                              {"samples", samples},       {"samples_per_s", static_cast<double>(samples - timed) / s},
                              {"max_rss_mb", max_rss_mb()}, {"checksum", checksum}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string const mode = argc > 1 ? argv[1] : "";
    if (mode == "make") return make(flags(argc, argv, 2));
    if (mode == "read") return read(flags(argc, argv, 2));
    if (mode == "--smoke") {
      auto dir = std::filesystem::temp_directory_path() / ("cohort_bench_shards_" + std::to_string(::getpid()));
      make({{"--out", dir.string()}, {"--gb", "0.002"}, {"--side", "64"}, {"--distinct", "8"}, {"--samples-per-shard", "50"}});
      int rc = read({{"--shards", dir.string()}, {"--workers", "2"}});
      std::filesystem::remove_all(dir);
      return rc;
    }
    std::cerr << "usage: bench_shard_loader make --out DIR --gb G [...] | read --shards DIR [...] | --smoke\n";
    return 2;
  } catch (std::exception const& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
