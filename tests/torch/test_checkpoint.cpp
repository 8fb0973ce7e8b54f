// Checkpoints through the trainer: exact (bitwise) resume after an interruption, retention with
// best-K, a failing checkpoint write, and model files Python can read.
#include <cohort/cohort.hpp>

#include "../small_net.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

using net = cohort_test::small_net;

cohort::tensor_dataset data() {
  auto x = torch::linspace(-1, 1, 90).reshape({30, 3});
  return {x, x.sum(1, true).sin()};
}

struct config {
  int epochs = 4;
  int fail_at = -1;  ///< throw on every rank just before the report of this training_iteration
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(config, epochs, fail_at)

/// Trains with a checkpoint at every epoch; resumes from ctx.checkpoint() when there is one.
std::vector<double> train(cohort::context& ctx, config const& cfg) {
  torch::manual_seed(11);
  auto model = ctx.prepare_model(net());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto& loader = ctx.dataset_shard("train", {.batch_size = 4});
  if (auto const& ck = ctx.checkpoint()) {
    cohort::loader_state position;
    cohort::load_checkpoint(*ck, model, opt, position);
    loader.restore(position);
  }
  while (loader.state().epoch < cfg.epochs) {
    double loss_sum = 0;
    for (auto& b : loader.epoch()) {
      opt.zero_grad();
      auto loss = torch::mse_loss(model(b.inputs), b.targets);
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>();
    }
    if (loader.state().epoch == cfg.fail_at) throw std::runtime_error("injected failure");
    ctx.report({{"loss", loss_sum}}, cohort::checkpoint_of(model, opt, loader.state()));
  }
  std::vector<double> out;
  for (auto& p : model->parameters()) {
    auto f = p.detach().flatten().to(torch::kDouble);
    out.insert(out.end(), f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
  }
  return out;
}

cohort::run_config run(std::filesystem::path const& storage, std::string name,
                       cohort::checkpoint_mode mode = cohort::checkpoint_mode::sync) {
  return {.name = std::move(name), .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 30'000,
          .resume_from_checkpoint = "", .checkpoint_mode = mode};
}

}  // namespace

TEST_CASE("a run interrupted after a checkpoint and rerun ends bitwise identical to an uninterrupted run", "[torch][checkpoint][mpi]") {
  auto storage = cohort_test::scratch("resume");
  auto mode = GENERATE(cohort::checkpoint_mode::sync, cohort::checkpoint_mode::async);
  CAPTURE(static_cast<int>(mode));
  std::string const tag = mode == cohort::checkpoint_mode::sync ? "sync" : "async";
  cohort::trainer t{train, cohort::datasets{{"train", data()}}, cohort::sharding::shuffled{.seed = 3},
                    cohort::checkpointing::keep_last{.num_to_keep = 2}};
  auto straight = t.fit(config{}, run(storage, "straight_" + tag, mode));
  REQUIRE(straight.ok());
  auto interrupted = t.fit(config{.fail_at = 3}, run(storage, "resumed_" + tag, mode));
  REQUIRE_FALSE(interrupted.ok());
  CHECK_THAT(*interrupted.error, contains_text("injected failure"));
  auto resumed = t.fit(config{}, run(storage, "resumed_" + tag, mode));  // the same command again
  REQUIRE(resumed.ok());
  CHECK(resumed.return_values == straight.return_values);  // bitwise: exact double equality
  CHECK(resumed.metrics["training_iteration"] == 4);
  CHECK(resumed.metrics_history.size() == 4);
  REQUIRE(resumed.checkpoint.has_value());
  CHECK(resumed.checkpoint->path.filename() == "checkpoint_000004");
  CHECK(resumed.best_checkpoints.size() == 2);  // keep_last{2}
  if (cohort_test::world_rank() == 0) {
    CHECK_FALSE(std::filesystem::exists(storage / ("resumed_" + tag) / "checkpoint_000001"));
    CHECK(std::filesystem::exists(storage / ("resumed_" + tag) / "checkpoint_000003"));
  }
}

TEST_CASE("keep_best retains the best k by metric plus the latest, listed best first", "[torch][checkpoint][mpi]") {
  auto storage = cohort_test::scratch("best");
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             for (double loss : {5.0, 3.0, 4.0, 1.0, 2.5, 6.0}) ctx.report({{"loss", loss}}, cohort::checkpoint_payload{});
                           },
                           cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "loss", .order = cohort::min}}
               .fit(nlohmann::json::object(), run(storage, "best"));
  REQUIRE(r.ok());
  REQUIRE(r.best_checkpoints.size() == 3);
  CHECK(r.best_checkpoints[0].metrics["loss"] == 1.0);
  CHECK(r.best_checkpoints[1].metrics["loss"] == 2.5);
  CHECK(r.best_checkpoints[2].metrics["loss"] == 6.0);  // the latest, kept for resume
  CHECK(r.checkpoint->metrics["training_iteration"] == 6);
  if (cohort_test::world_rank() == 0) {
    std::vector<std::string> names;
    for (auto const& d : cohort::checkpointing::committed(storage / "best")) names.push_back(d.filename().string());
    CHECK(names == std::vector<std::string>{"checkpoint_000004", "checkpoint_000005", "checkpoint_000006"});
  }
}

TEST_CASE("a checkpoint write that fails on one rank fails the run on every rank and keeps the last good one", "[torch][checkpoint][mpi]") {
  auto storage = cohort_test::scratch("badwrite");
  int const last = cohort_test::world_size() - 1;
  auto r = cohort::trainer{[&](cohort::context& ctx) {
             ctx.report({{"step", 1}}, cohort::checkpoint_payload{});
             ctx.report({{"step", 2}}, cohort::checkpoint_payload{[&](std::filesystem::path const&, int rank) {
                          if (rank == last) throw cohort::error("disk full (injected)");
                        }});
           }}.fit(nlohmann::json::object(), run(storage, "badwrite"));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("writing checkpoint checkpoint_000002 failed: disk full (injected)"));
  if (cohort_test::world_rank() == 0) {
    CHECK(cohort::checkpointing::latest_good(storage / "badwrite")->path().filename() == "checkpoint_000001");
    CHECK_FALSE(std::filesystem::exists(storage / "badwrite" / "checkpoint_000002"));
  }
}

TEST_CASE("model weights are a safetensors file that safetensors (and so Python) reads", "[torch][checkpoint]") {
  auto dir = std::filesystem::temp_directory_path() / "cohort_tests" / ("safetensors_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  torch::manual_seed(1);
  net model;
  torch::optim::SGD opt(model->parameters(), 0.1);
  cohort::checkpoint_of(model, opt, 7).write(dir, 0);
  auto saved = cohort::safetensors::load(dir / "model.safetensors");
  REQUIRE(saved.size() == 4);
  CHECK(saved[0].first == "l1.bias");  // the header's (sorted) order
  // The header's length, and the header: padded so that the tensors' bytes start on a page boundary.
  auto header_of = [](std::filesystem::path const& file) {
    std::ifstream in(file, std::ios::binary);
    unsigned char length[8] = {};
    in.read(reinterpret_cast<char*>(length), 8);
    std::uint64_t n = 0;
    for (int k = 0; k < 8; ++k) n |= std::uint64_t{length[k]} << (8 * k);
    std::string text(n, ' ');
    in.read(text.data(), static_cast<std::streamsize>(n));
    return std::pair{n, nlohmann::json::parse(text)};
  };
  auto const model_header_bytes = header_of(dir / "model.safetensors").first;
  CHECK((8 + model_header_bytes) % cohort::safetensors::data_alignment_bytes == 0);
  CHECK(std::filesystem::file_size(dir / "model.safetensors") == 8 + model_header_bytes + (6 * 3 + 6 + 6 + 1) * sizeof(float));
  for (auto const& [name, t] : saved)
    if (name == "l1.weight") CHECK(torch::equal(t, model->l1->weight));
  CHECK(nlohmann::json::parse(std::ifstream(dir / "state.json"))["values"][0] == 7);
  // A tensor of a whole number of cache lines goes before one that is not, so it stays aligned.
  auto const odd = torch::arange(3, torch::kFloat), whole = torch::arange(16, torch::kFloat);
  cohort::safetensors::save(dir / "mixed.safetensors", {{"odd", odd}, {"whole", whole}});
  auto mixed = cohort::safetensors::load(dir / "mixed.safetensors");
  REQUIRE(mixed.size() == 2);
  CHECK(torch::equal(mixed[0].second, odd));
  CHECK(torch::equal(mixed[1].second, whole));
  CHECK(header_of(dir / "mixed.safetensors").second["whole"]["data_offsets"] == nlohmann::json{0, 64});
  // Python's safetensors reads the same files: run by ctest's torch.safetensors_python, which
  // makes a venv with safetensors and names its python in COHORT_TEST_PYTHON.
  if (char const* python = std::getenv("COHORT_TEST_PYTHON")) {
    auto cmd = std::string(python) +
               " -c \"from safetensors.numpy import load_file; import sys; t = load_file(sys.argv[1]); "
               "assert t['l1.weight'].shape == (6, 3), t.keys(); m = load_file(sys.argv[2]); "
               "assert list(m['odd']) == [0, 1, 2] and list(m['whole']) == list(range(16)), m; print('python read', sorted(t))\" " +
               (dir / "model.safetensors").string() + " " + (dir / "mixed.safetensors").string();
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

namespace {

/// Two steps of `opt` on `model`: state (momentum, moments) that the next step changes.
template <class Opt>
void steps(net& model, Opt& opt, int n) {
  auto x = torch::linspace(-1, 1, 30).reshape({10, 3});
  for (int i = 0; i < n; ++i) {
    opt.zero_grad();
    torch::mse_loss(model(x), x.sum(1, true).sin()).backward();
    opt.step();
  }
}

/// checkpoint_of's async path for one optimizer kind: snapshot, train on, write, load. The
/// loaded optimizer must equal the one at the snapshot: stepping both gives identical weights.
template <class Opt, class Options>
bool snapshot_holds(std::string const& kind, Options options) {
  // One scratch directory per kind: rank 0 empties it while other ranks may still use the last.
  auto dir = cohort_test::scratch("optimizer_snapshot_" + kind) / std::to_string(cohort_test::world_rank());
  std::filesystem::create_directories(dir);
  torch::manual_seed(5);
  net model;
  Opt opt(model->parameters(), options);
  steps(model, opt, 2);
  auto payload = cohort::checkpoint_of(model, opt);
  payload.snapshot(0);
  net reference;  // the state at the snapshot, continued from there
  for (std::size_t i = 0; i < model->parameters().size(); ++i)
    reference->parameters()[i].data().copy_(model->parameters()[i].data());
  Opt reference_opt(reference->parameters(), options);
  {
    torch::serialize::OutputArchive a;
    opt.save(a);
    std::ostringstream bytes;
    a.save_to(bytes);
    std::istringstream in(bytes.str());
    torch::serialize::InputArchive b;
    b.load_from(in);
    reference_opt.load(b);
  }
  steps(model, opt, 3);  // training goes on while the write is pending: the live state changes
  payload.write(dir, 0);
  net restored;
  Opt restored_opt(restored->parameters(), options);
  cohort::load_checkpoint(cohort::checkpoint::from_directory(dir), restored, restored_opt);
  steps(reference, reference_opt, 1);
  steps(restored, restored_opt, 1);
  bool same = true;
  for (std::size_t i = 0; i < reference->parameters().size(); ++i)
    same = same && torch::equal(reference->parameters()[i], restored->parameters()[i]);
  return same;
}

}  // namespace

TEST_CASE("an async snapshot keeps the optimizer's state of that moment while training goes on", "[torch][checkpoint]") {
  namespace optim = torch::optim;
  CHECK(snapshot_holds<optim::SGD>("sgd", optim::SGDOptions(0.1).momentum(0.9)));
  CHECK(snapshot_holds<optim::Adam>("adam", optim::AdamOptions(0.01).amsgrad(true)));
  CHECK(snapshot_holds<optim::AdamW>("adamw", optim::AdamWOptions(0.01)));
  CHECK(snapshot_holds<optim::Adagrad>("adagrad", optim::AdagradOptions(0.1)));
  CHECK(snapshot_holds<optim::RMSprop>("rmsprop", optim::RMSpropOptions(0.01).momentum(0.5).centered(true)));
}

TEST_CASE("async checkpoints are written while training goes on, and all are committed by the end", "[torch][checkpoint][mpi]") {
  auto storage = cohort_test::scratch("async");
  auto r = cohort::trainer{[](cohort::context& ctx) {
             for (int k = 0; k < 3; ++k) {
               auto released = std::make_shared<std::promise<void>>();
               ctx.report({{"k", k}}, cohort::checkpoint_payload{[released](std::filesystem::path const& dir, int) {
                            // Waits until the training thread has gone on past report() (5 s at most):
                            // in sync mode this would time out and write 0.
                            auto ok = released->get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready;
                            std::ofstream(dir / "w.txt") << ok;
                          }});
               released->set_value();  // training continues while the writer waits for this
             }
           }}.fit(nlohmann::json::object(), run(storage, "async", cohort::checkpoint_mode::async));
  REQUIRE(r.ok());
  REQUIRE(r.best_checkpoints.size() == 3);
  if (cohort_test::world_rank() == 0)
    for (auto const& c : r.best_checkpoints) {
      CHECK_FALSE(cohort::checkpointing::verify(c.path).has_value());
      std::ifstream in(c.path / "w.txt");
      int ok = 0;
      in >> ok;
      CHECK(ok == 1);  // the write finished after report() had returned
    }
}

TEST_CASE("in async mode the progress lines come out in report order, each once, by the end of fit", "[torch][checkpoint][mpi]") {
  // Rank 0's lines share the writer's thread: a checkpointed report's line is printed by its
  // write's job, the others are queued behind it.
  auto storage = cohort_test::scratch("async_lines");
  std::filesystem::create_directories(storage);
  auto const out = storage / ("stdout_" + std::to_string(cohort_test::world_rank()) + ".txt");
  std::fflush(stdout);
  int const saved = ::dup(STDOUT_FILENO);
  int const fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  ::dup2(fd, STDOUT_FILENO);
  auto config = run(storage, "lines", cohort::checkpoint_mode::async);
  config.verbose = 1;
  auto r = cohort::trainer{[](cohort::context& ctx) {
             for (int k = 0; k < 6; ++k) {
               if (k % 2 == 0) {
                 ctx.report({{"k", k}}, cohort::checkpoint_payload{[](std::filesystem::path const& dir, int) {
                              std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a slow write
                              std::ofstream(dir / "w.txt") << 1;
                            }});
               } else {
                 ctx.report({{"k", k}});
               }
             }
           }}.fit(nlohmann::json::object(), config);
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(fd);
  REQUIRE(r.ok());
  std::vector<int> iterations;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto const at = line.find(" iter ");
    if (line.rfind("[cohort] lines", 0) == 0 && at != std::string::npos) iterations.push_back(std::stoi(line.substr(at + 6)));
  }
  if (cohort_test::world_rank() == 0) CHECK(iterations == std::vector<int>{1, 2, 3, 4, 5, 6});
  else CHECK(iterations.empty());
}

TEST_CASE("async validation merges its metrics into the right checkpoint and best-K ranks by them", "[torch][checkpoint][mpi]") {
  auto storage = cohort_test::scratch("validate");
  auto mode = GENERATE(cohort::checkpoint_mode::sync, cohort::checkpoint_mode::async);
  std::string const tag = mode == cohort::checkpoint_mode::sync ? "sync" : "async";
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             for (int k = 1; k <= 4; ++k)
                               ctx.report({{"loss", 1.0 / k}, {"val", -1}},
                                          cohort::checkpoint_payload{[k](std::filesystem::path const& dir, int rank) {
                                            if (rank == 0) std::ofstream(dir / "k.txt") << k;
                                          }},
                                          [](cohort::checkpoint const& ck) {
                                            int k = 0;
                                            std::ifstream(ck.path() / "k.txt") >> k;  // reads the checkpoint it validates
                                            std::this_thread::sleep_for(std::chrono::milliseconds(50));
                                            return nlohmann::json{{"val", k == 2 ? 100 : k}};  // checkpoint 2 validates best
                                          });
                           },
                           cohort::checkpointing::keep_best{.num_to_keep = 1, .metric = "val", .order = cohort::max}}
               .fit(nlohmann::json::object(), run(storage, "validate_" + tag, mode));
  REQUIRE(r.ok());
  REQUIRE(r.best_checkpoints.size() == 2);  // the best by validation, and the latest
  CHECK(r.best_checkpoints[0].path.filename() == "checkpoint_000002");
  CHECK(r.best_checkpoints[0].metrics["val"] == 100);   // the validation's value replaced the reported one
  CHECK(r.best_checkpoints[0].metrics["loss"] == 0.5);  // the training metrics are still there
  CHECK(r.best_checkpoints[1].path.filename() == "checkpoint_000004");
  CHECK(r.best_checkpoints[1].metrics["val"] == 4);
  if (cohort_test::world_rank() == 0)
    CHECK(nlohmann::json::parse(std::ifstream(r.best_checkpoints[0].path / "validation.json"))["val"] == 100);
}

namespace {

/// How a deferred-copy test trains after its checkpointed report.
enum class after_report { step_after_backward, change_in_place };

struct deferred_outcome {
  cohort::result<void> result;
  std::vector<torch::Tensor> at_report;  ///< rank 0's parameters when report() was called
  bool copy_began_by_backward_end = false;  ///< the writer had begun its copy when the next backward returned
  bool writer_saw_backward_end = false;  ///< the writer, waiting for it, saw that backward end first
};

/// Trains a prepared model a few steps, reports an async checkpoint whose copy the writer starts
/// late, then trains on as `then` says. On more than one rank checkpoint_of defers the parameter
/// and optimizer copy to the writer. The writer starts its copy once the next backward has returned
/// or after a wait (3 s; with `copy_after_backward`, 10 s, and it records which came first): a
/// backward that waits for the copy makes it wait that long. After an in-place change, it starts
/// once the change is made.
deferred_outcome train_with_slow_writer(std::string const& name, after_report then, bool report_before_step = false,
                                        bool copy_after_backward = false) {
  auto storage = cohort_test::scratch(name);
  deferred_outcome out;
  // What the training thread has done after report(): 1 the in-place change (if any), 2 the backward.
  auto stage = std::make_shared<std::atomic<int>>(0);
  auto copy_began = std::make_shared<std::atomic<bool>>(false);
  auto saw_backward_end = std::make_shared<std::atomic<bool>>(false);
  auto wait_for_stage = [stage](int s, std::chrono::seconds limit = std::chrono::seconds(10)) {
    auto const until = std::chrono::steady_clock::now() + limit;
    while (stage->load() < s && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return stage->load() >= s;
  };
  out.result = cohort::trainer{[&](cohort::context& ctx) {
                 torch::manual_seed(3);
                 auto model = ctx.prepare_model(net());
                 torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
                 auto x = torch::linspace(-1, 1, 30).reshape({10, 3});
                 auto backward = [&] {
                   opt.zero_grad();
                   torch::mse_loss(model(x), x.sum(1, true).sin()).backward();
                 };
                 for (int i = 0; i < 3; ++i) {
                   backward();
                   opt.step();
                 }
                 ctx.report({{"k", 1}}, cohort::checkpoint_of(model, opt));  // committed before the slow one
                 if (report_before_step) backward();
                 for (auto const& p : model->parameters()) out.at_report.push_back(p.detach().clone());
                 auto payload = cohort::checkpoint_of(model, opt);
                 auto copy = payload.finish_snapshot;
                 payload.finish_snapshot = [=] {
                   if (then == after_report::change_in_place) wait_for_stage(1);
                   else if (copy_after_backward) saw_backward_end->store(wait_for_stage(2));
                   else wait_for_stage(2, std::chrono::seconds(3));
                   copy_began->store(true);  // before: the copy's end lets the training thread go on
                   copy();
                 };
                 ctx.report({{"k", 2}}, payload);
                 if (report_before_step) opt.step();  // right away: report() must have copied already
                 if (then == after_report::change_in_place) {
                   torch::NoGradGuard no_grad;
                   model->parameters()[0].mul_(2);  // not an optimizer step, and no backward before it
                 }
                 stage->store(1);
                 backward();  // its end waits for a deferred copy
                 out.copy_began_by_backward_end = copy_began->load();
                 stage->store(2);
                 opt.step();
               }}.fit(nlohmann::json::object(), run(storage, name, cohort::checkpoint_mode::async));
  out.writer_saw_backward_end = saw_backward_end->load();
  return out;
}

/// Whether checkpoint_000002 of `r` holds exactly `params` (read on every rank).
bool holds_parameters(cohort::result<void> const& r, std::vector<torch::Tensor> const& params) {
  net loaded;
  cohort::load_checkpoint(cohort::checkpoint::from_directory(r.path / "checkpoint_000002"), loaded);
  auto const got = loaded->parameters();
  if (got.size() != params.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!torch::equal(got[i], params[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("an async checkpoint of a prepared model is copied by the writer while the next backward runs, and holds the report's state", "[torch][checkpoint][mpi]") {
  auto out = train_with_slow_writer("deferred", after_report::step_after_backward);
  REQUIRE(out.result.ok());
  if (cohort_test::world_rank() == 0) CHECK(holds_parameters(out.result, out.at_report));
  // On one rank there is no reducer to hold the step: report() copies at once. On more, the
  // backward's end waited for the writer's copy, which began only after 3 s without that backward
  // ending. Catches a backward that does not wait for the deferred copy: it ends, the writer sees
  // it and only then begins, so the copy had not begun at its end (whatever the machine's load).
  if (cohort_test::world_size() > 1 && cohort_test::world_rank() == 0) CHECK(out.copy_began_by_backward_end);
}

TEST_CASE("a report between backward and optimizer step copies at once", "[torch][checkpoint][mpi]") {
  auto out = train_with_slow_writer("eager", after_report::step_after_backward, /*report_before_step=*/true,
                                    /*copy_after_backward=*/true);
  REQUIRE(out.result.ok());
  if (cohort_test::world_rank() == 0) CHECK(holds_parameters(out.result, out.at_report));
  // Nothing deferred, nothing to wait for: the backward ended while the writer waited for it.
  if (cohort_test::world_rank() == 0) CHECK(out.writer_saw_backward_end);
}

TEST_CASE("a parameter changed in place before the deferred copy fails that checkpoint on every rank and keeps the last good one", "[torch][checkpoint][mpi]") {
  auto out = train_with_slow_writer("torn", after_report::change_in_place);
  if (cohort_test::world_size() == 1) {  // copied at report(): the change came later and is harmless
    CHECK(out.result.ok());
    return;
  }
  REQUIRE_FALSE(out.result.ok());
  CHECK_THAT(*out.result.error, contains_text("checkpoint checkpoint_000002 was not written: the model or optimizer changed in place after report()"));
  if (cohort_test::world_rank() == 0) {
    CHECK(cohort::checkpointing::latest_good(out.result.path)->path().filename() == "checkpoint_000001");
    CHECK_FALSE(std::filesystem::exists(out.result.path / "checkpoint_000002"));
  }
}

TEST_CASE("a safetensors file whose header claims more than the file holds is an error, never an allocation", "[torch][checkpoint][bad-input]") {
  auto const file = std::filesystem::temp_directory_path() / "cohort_tests" / ("hostile_" + std::to_string(getpid()) + ".safetensors");
  std::filesystem::create_directories(file.parent_path());
  // 8-byte little-endian header length `n`, the header, then `body` bytes.
  auto write = [&](std::uint64_t n, std::string const& header, std::size_t body) {
    std::string bytes(8, '\0');
    for (int k = 0; k < 8; ++k) bytes[static_cast<std::size_t>(k)] = static_cast<char>((n >> (8 * k)) & 0xff);
    bytes += header + std::string(body, '\0');
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto header = [](nlohmann::json const& entry) { return nlohmann::json{{"w", entry}}.dump(); };
  // A file of one tensor 'w' described by `entry`, with its true header length and an 8-byte body.
  auto write_entry = [&](nlohmann::json const& entry) {
    auto const h = header(entry);
    write(h.size(), h, 8);
  };
  std::string expect;
  SECTION("a header length past the end (and one that would wrap around)") {
    auto const h = header({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}});
    write(~std::uint64_t{0}, h, 8);
    expect = "header length 18446744073709551615 past the end of the file";
  }
  SECTION("a terabyte shape in a small file") {
    write_entry({{"dtype", "F32"}, {"shape", {std::uint64_t{1} << 20, std::uint64_t{1} << 20, 64}}, {"data_offsets", {0, 8}}});
    expect = "tensor 'w': shape [1048576,1048576,64] is larger than the file";
  }
  SECTION("a shape that does not match its bytes") {
    write_entry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 8}}});
    expect = "tensor 'w': shape [1] of F32 needs 4 bytes, data_offsets give 8";
  }
  SECTION("offsets past the end") {
    write_entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 4096}}});
    expect = "tensor 'w': data_offsets [0, 4096] lie past the end of the file";
  }
  SECTION("offsets that are not numbers") {
    write_entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", "0-8"}});
    expect = "tensor 'w': field 'data_offsets' is not two byte offsets";
  }
  SECTION("a negative dimension") {
    write_entry({{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}});
    expect = "tensor 'w': field 'shape' holds -2, not a dimension";
  }
  SECTION("a zero dimension beside one that does not fit in a tensor's int64 sizes") {
    write_entry({{"dtype", "F32"}, {"shape", {std::uint64_t{0}, ~std::uint64_t{0}}}, {"data_offsets", {0, 0}}});
    expect = "tensor 'w': shape [0,18446744073709551615] has dimensions whose product exceeds 2^63";
  }
  SECTION("an unknown dtype") {
    write_entry({{"dtype", "F128"}, {"shape", {2}}, {"data_offsets", {0, 8}}});
    expect = "unsupported dtype F128";
  }
  CHECK_THROWS_WITH(cohort::safetensors::load(file), contains_text(expect));
}

namespace {

/// The first layer of the small net only: a model whose tensors are a subset of the file's.
struct first_layerImpl : torch::nn::Module {
  first_layerImpl() : l1(register_module("l1", torch::nn::Linear(3, 6))) {}
  torch::nn::Linear l1;
};
TORCH_MODULE(first_layer);

}  // namespace

TEST_CASE("load_checkpoint refuses a checkpoint of another model or optimizer, and reads one without recorded kinds", "[torch][checkpoint][bad-input]") {
  // This process's own folder (no collective: the test runs on each rank alone, once per section).
  auto const dir = std::filesystem::temp_directory_path() / "cohort_tests" / ("strict_load_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  torch::manual_seed(5);
  net model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  steps(model, opt, 2);  // momentum buffers: state another optimizer kind cannot read
  cohort::checkpoint_of(model, opt, 7).write(dir, 0);
  auto const ck = cohort::checkpoint::from_directory(dir);
  net same;
  torch::optim::SGD same_opt(same->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  int value = 0;
  SECTION("a model lacking a tensor of the file") {
    first_layer part;
    CHECK_THROWS_WITH(cohort::load_checkpoint(ck, part), contains_text("model.safetensors has tensor 'l2.") && contains_text("', which the model does not"));
  }
  SECTION("an optimizer of another kind") {
    torch::optim::Adam adam(same->parameters());
    CHECK_THROWS_WITH(cohort::load_checkpoint(ck, same, adam, value),
                      contains_text("optimizer.pt holds the state of a SGD optimizer, not of this Adam"));
  }
  SECTION("a checkpoint written before the kinds were recorded: loads, and another kind is still an error") {
    std::ofstream(dir / "state.json", std::ios::trunc) << nlohmann::json{{"values", {7}}}.dump();
    CHECK_NOTHROW(cohort::load_checkpoint(ck, same, same_opt, value));
    CHECK(value == 7);
    torch::optim::Adam adam(same->parameters());
    CHECK_THROWS_WITH(cohort::load_checkpoint(ck, same, adam), contains_text("does not load into this optimizer (") &&
                                                                 !contains_text("Exception raised from"));
  }
  SECTION("more optimizers than were saved") {
    torch::optim::SGD second(same->parameters(), torch::optim::SGDOptions(0.1));
    CHECK_THROWS_WITH(cohort::load_checkpoint(ck, same, same_opt, second), contains_text("has no optimizer_1.pt"));
  }
  SECTION("a value of another type") {
    std::string text;
    CHECK_THROWS_WITH(cohort::load_checkpoint(ck, same, same_opt, text), contains_text("value 0 of state.json does not convert"));
  }
}
