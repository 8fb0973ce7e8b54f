// The run that tests/commit_kill.sh SIGKILLs at random points of its checkpoint commits: a report
// with a checkpoint every step (a data file of --bytes bytes whose every byte is the step's
// letter, written in 4 pieces 2 ms apart, and state.json with the step), checkpointing::keep_last{2} so that every commit after
// the second also drops one (retention's rename into .trash and its deletion). On resume it reads
// the checkpoint back: the data file's size and bytes must be those of the step state.json names,
// else it exits 3. Rank 0 prints "resumed from checkpoint_NNNNNN at step K" (or "fresh run") and
// then "training": the script kills it after that line. It stops after --steps steps.
// `--verify DIR` checks a committed checkpoint against its manifest.
#include <cohort/checkpointing/policies.hpp>
#include <cohort/trainer.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  std::string storage = "runs";
  std::int64_t steps = 1'000'000, bytes = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i], v = argv[i + 1];
    if (f == "--storage") storage = v;
    else if (f == "--steps") steps = std::stoll(v);
    else if (f == "--bytes") bytes = std::stoll(v);
    else if (f == "--verify") {
      auto problem = cohort::checkpointing::verify(v);
      std::cout << (problem ? "corrupt: " + *problem : std::string("verified")) << "\n";
      return problem ? 1 : 0;
    }
  }
  auto letter = [](std::int64_t step) { return static_cast<char>('a' + step % 26); };
  auto train = [&](cohort::context& ctx) {
    std::int64_t step = 0;
    if (auto const& c = ctx.checkpoint()) {
      step = nlohmann::json::parse(std::ifstream(c->path() / "state.json")).at("step").get<std::int64_t>();
      std::ifstream data(c->path() / "data.bin", std::ios::binary);
      std::string const got{std::istreambuf_iterator<char>(data), std::istreambuf_iterator<char>()};
      if (static_cast<std::int64_t>(got.size()) != bytes || got.find_first_not_of(letter(step)) != std::string::npos) {
        std::cerr << "error: " << c->path().string() << ": data.bin is not step " << step << "'s\n";
        std::exit(3);
      }
      if (ctx.world_rank() == 0) std::cout << "resumed from " << c->path().filename().string() << " at step " << step << "\n";
    } else if (ctx.world_rank() == 0) {
      std::cout << "fresh run\n";
    }
    if (ctx.world_rank() == 0) std::cout << "training" << std::endl;
    while (step < steps) {
      ++step;
      ctx.report({{"step", step}},
                 cohort::checkpoint_payload{.write = [&, step](std::filesystem::path const& dir, int) {
                   // In 4 pieces 2 ms apart, as a slow serialiser writes: kills land in it too.
                   std::ofstream data(dir / "data.bin", std::ios::binary);
                   for (int piece = 0; piece < 4; ++piece) {
                     data << std::string(static_cast<std::size_t>(bytes / 4 + (piece == 3 ? bytes % 4 : 0)), letter(step)) << std::flush;
                     std::this_thread::sleep_for(std::chrono::milliseconds(2));
                   }
                   std::ofstream(dir / "state.json") << nlohmann::json{{"step", step}}.dump();
                 }});
    }
  };
  auto result = cohort::trainer{train, cohort::checkpointing::keep_last{.num_to_keep = 2}}.fit(
      nlohmann::json::object(), {.name = "run", .storage_path = storage, .verbose = 0});
  return result.ok() ? 0 : 1;
}
