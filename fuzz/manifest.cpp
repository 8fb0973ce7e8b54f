// libFuzzer target: checkpointing::verify() on an arbitrary manifest.json, in a checkpoint
// directory that holds model.bin and sub/rank1.bin, next to a file outside it. verify() must
// return (never throw, crash or read past its buffers), and may accept only names that stay
// inside the directory.
#include <cohort/checkpointing/checkpoint.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace {

std::filesystem::path const& checkpoint_dir() {
  static auto const dir = [] {
    auto const base = std::filesystem::temp_directory_path() / ("cohort_fuzz_manifest_" + std::to_string(getpid()));
    std::filesystem::create_directories(base / "checkpoint_000001" / "sub");
    std::ofstream(base / "outside.bin") << "outside";
    std::ofstream(base / "checkpoint_000001" / "model.bin") << "weights";
    std::ofstream(base / "checkpoint_000001" / "sub" / "rank1.bin") << "per-rank state";
    return base / "checkpoint_000001";
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  auto const& dir = checkpoint_dir();
  {
    std::ofstream out(dir / "manifest.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<char const*>(data), static_cast<std::streamsize>(size));
  }
  if (cohort::checkpointing::verify(dir)) return 0;  // refused, with a reason
  // Accepted: every listed name must be a safe one.
  std::ifstream in(dir / "manifest.json");
  auto const m = nlohmann::json::parse(in, nullptr, false);
  for (auto const& f : m["files"])
    if (cohort::checkpointing::unsafe_name(f["name"].get<std::string>())) std::abort();
  return 0;
}
