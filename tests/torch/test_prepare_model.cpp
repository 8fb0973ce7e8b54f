// prepare_model over MPI: broadcast, layout check, bucketed gradient averaging, no_sync, and the
// synchronous data-parallel equivalence with one process and an N-times larger batch.
#include <cohort/cohort.hpp>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

struct mlpImpl : torch::nn::Module {
  explicit mlpImpl(int hidden = 8)
      : l1(register_module("l1", torch::nn::Linear(4, hidden))),
        l2(register_module("l2", torch::nn::Linear(hidden, hidden))),
        l3(register_module("l3", torch::nn::Linear(hidden, 1))),
        unused(register_module("unused", torch::nn::Linear(2, 2))) {}
  torch::Tensor forward(torch::Tensor x) { return l3(torch::tanh(l2(torch::tanh(l1(x))))); }
  torch::nn::Linear l1, l2, l3, unused;
};
TORCH_MODULE(mlp);

using cohort_test::quiet;

/// Samples of step s: rows [s*B, (s+1)*B) of a fixed data set, B = the global batch.
torch::Tensor inputs(std::int64_t rows) {
  return torch::linspace(-2, 2, rows * 4, torch::kFloat).reshape({rows, 4}).sin();
}
torch::Tensor targets(torch::Tensor const& x) { return (x.sum(1, true) * 0.7).cos(); }

std::vector<torch::Tensor> flat_params(torch::nn::Module const& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

/// Relative tolerance check, element-wise: |a - b| <= rtol * max(|a|, |b|) + 1e-7.
bool close(std::vector<torch::Tensor> const& a, std::vector<torch::Tensor> const& b, double rtol) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto tol = rtol * torch::max(a[i].abs(), b[i].abs()) + 1e-7;
    if (!((a[i] - b[i]).abs() <= tol).all().item<bool>()) return false;
  }
  return true;
}

/// Where autograd put each parameter's gradient: a hook after each accumulation (registered
/// before prepare_model's, so run before them) notes .grad's storage; check_after_backward()
/// clears `in_place` where .grad was then elsewhere.
struct grad_storage_seen {
  struct note final : torch::autograd::FunctionPostHook {
    note(torch::Tensor p, void const** out) : param(std::move(p)), at(out) {}
    torch::autograd::variable_list operator()(torch::autograd::variable_list const& outputs,
                                              torch::autograd::variable_list const&) override {
      *at = param.grad().data_ptr();
      return outputs;
    }
    torch::Tensor param;
    void const** at;
  };
  explicit grad_storage_seen(std::vector<torch::Tensor> params) : params(std::move(params)), where(this->params.size()) {
    for (std::size_t i = 0; i < this->params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(this->params[i]);
      keys.push_back(acc->add_post_hook(std::make_unique<note>(this->params[i], &where[i])));
      accumulators.push_back(std::move(acc));
    }
  }
  ~grad_storage_seen() {
    for (std::size_t i = 0; i < accumulators.size(); ++i) accumulators[i]->del_post_hook(keys[i]);
  }
  void check_after_backward() {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (where[i] != nullptr && where[i] != params[i].grad().data_ptr()) in_place = false;
    std::fill(where.begin(), where.end(), nullptr);
  }
  std::vector<torch::Tensor> params;
  std::vector<void const*> where;
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor const&>()))> accumulators;
  std::vector<std::uintptr_t> keys;
  bool in_place = true;
};

constexpr std::int64_t per_rank_batch = 5;
constexpr int steps = 6;

/// One process, global batch N*b: the reference.
std::vector<torch::Tensor> reference(int world, bool accumulate, int hidden = 8) {
  torch::manual_seed(3);
  mlp model(hidden);
  auto const dtype = hidden > 8 ? torch::kDouble : torch::kFloat;  // wide: float rounding would blur the comparison
  model->to(dtype);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto const global = per_rank_batch * world;
  auto x = inputs(global * steps).to(dtype), y = targets(x);
  for (int s = 0; s < steps; ++s) {
    auto xs = x.narrow(0, s * global, global), ys = y.narrow(0, s * global, global);
    opt.zero_grad();
    if (accumulate) {  // two micro-batches, each half of the mean
      auto half = global / 2;
      (torch::mse_loss(model(xs.narrow(0, 0, half)), ys.narrow(0, 0, half)) * half / global).backward();
      (torch::mse_loss(model(xs.narrow(0, half, global - half)), ys.narrow(0, half, global - half)) *
       (global - half) / global)
          .backward();
    } else {
      torch::mse_loss(model(xs), ys).backward();
    }
    opt.step();
  }
  return flat_params(*model);
}

/// Trains `steps` steps on this rank's part of each global batch and returns whether the final
/// parameters match the one-process reference with the global batch, plus the bucket count.
/// Tiny buckets (many in flight) unless `hidden` is given: then the default caps, and buckets
/// as large as the hidden layer. "in_place": whether autograd accumulated every gradient straight
/// into the storage that .grad holds after backward (the bucket slot), none into a fresh tensor.
/// `move_to_thread`: given to the reducer (detail::prepare_model_with) instead of the link's
/// check; "on_thread": whether the reducer ends on its communication thread.
nlohmann::json train_and_compare(cohort::context& ctx, bool accumulate, bool set_to_none = false,
                                 cohort::reduce_on where = cohort::reduce_on::automatic, int hidden = 0,
                                 std::function<bool()> move_to_thread = {}) {
  auto expected = reference(ctx.world_size(), accumulate, hidden > 0 ? hidden : 8);
  torch::manual_seed(ctx.world_rank() == 0 ? 3 : 100 + ctx.world_rank());  // the broadcast must fix other ranks
  auto options = hidden > 0 ? cohort::model_options{.reduce_on = where}
                            : cohort::model_options{.bucket_cap_bytes = 60, .first_bucket_cap_bytes = 20, .reduce_on = where};
  mlp net(hidden > 0 ? hidden : 8);
  net->to(hidden > 0 ? torch::kDouble : torch::kFloat);
  grad_storage_seen seen(net->parameters());  // its hooks run before prepare_model's
  auto model = move_to_thread ? cohort::detail::prepare_model_with(ctx, net, options, move_to_thread) : ctx.prepare_model(net, options);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto const global = per_rank_batch * ctx.world_size();
  auto x = inputs(global * steps).to(hidden > 0 ? torch::kDouble : torch::kFloat), y = targets(x);
  for (int s = 0; s < steps; ++s) {
    auto lo = s * global + ctx.world_rank() * per_rank_batch;
    auto xs = x.narrow(0, lo, per_rank_batch), ys = y.narrow(0, lo, per_rank_batch);
    if (set_to_none)  // LibTorch 2.x's zero_grad() default: .grad is replaced, the reducer rebinds it
      for (auto& p : model->parameters()) p.mutable_grad().reset();
    else
      opt.zero_grad();
    if (accumulate) {  // the same micro-batches per rank: 2 then 3 samples, the first without sync
      {
        auto guard = model.no_sync();
        (torch::mse_loss(model(xs.narrow(0, 0, 2)), ys.narrow(0, 0, 2)) * 2 / per_rank_batch).backward();
      }
      (torch::mse_loss(model(xs.narrow(0, 2, 3)), ys.narrow(0, 2, 3)) * 3 / per_rank_batch).backward();
    } else {
      torch::mse_loss(model(xs), ys).backward();
    }
    seen.check_after_backward();
    opt.step();
  }
  return {{"close", close(flat_params(*model), expected, 1e-5)}, {"buckets", model.num_buckets()}, {"in_place", seen.in_place},
          {"on_thread", model.reducer() && model.reducer()->on_communication_thread()}};
}

}  // namespace

TEST_CASE("data-parallel equivalence: N ranks with batch b match one process with batch N*b", "[torch][equivalence][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) { return train_and_compare(ctx, false); }}.fit(
      nlohmann::json::object(), quiet("equivalence"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    CHECK(v["close"] == true);
    if (cohort_test::world_size() > 1) CHECK(v["buckets"].get<int>() > 3);  // several buckets in flight
  }
}

TEST_CASE("equivalence holds with buckets reduced on a communication thread or the training thread", "[torch][equivalence][mpi]") {
  for (auto where : {cohort::reduce_on::communication_thread, cohort::reduce_on::training_thread}) {
    auto r = cohort::trainer{[&](cohort::context& ctx) { return train_and_compare(ctx, where == cohort::reduce_on::training_thread, false, where); }}
                 .fit(nlohmann::json::object(), quiet("threads"));
    REQUIRE(r.ok());
    REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
    for (auto const& v : r.return_values) CHECK(v["close"] == true);
  }
}

TEST_CASE("the reducer moves to its communication thread mid-run when every rank says so, and equivalence holds", "[torch][equivalence][mpi]") {
  // As an automatic reducer across hosts does once the link is measured slow. Accumulating:
  // no_sync passes between, which are not counted. Tiny buckets (MPI's all-reduce) and buckets
  // of 288 KiB (the ring all-reduce). Rank 0 on the thread from the start, as a rank alone on
  // its host is with automatic across uneven hosts: not asked, it counts as yes.
  static_assert(cohort::detail::gradient_reducer::link_decision_pass < steps, "some steps must run on the thread");
  for (bool const rank0_on_thread : {false, true}) {
    for (bool const every_rank : {true, false}) {
      for (int const hidden : {0, 192}) {
        auto r = cohort::trainer{[&](cohort::context& ctx) {
                   int asked = 0;
                   bool const starts_on_thread = rank0_on_thread && ctx.world_rank() == 0;
                   auto const where = starts_on_thread ? cohort::reduce_on::communication_thread : cohort::reduce_on::training_thread;
                   auto v = train_and_compare(ctx, true, false, where, hidden, [&] {
                     ++asked;
                     return every_rank || ctx.world_rank() + 1 < ctx.world_size();  // else the last rank says no
                   });
                   v["asked"] = asked;
                   v["started_on_thread"] = starts_on_thread;
                   return v;
                 }}.fit(nlohmann::json::object(), quiet("move_to_thread"));
        REQUIRE(r.ok());
        REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
        bool const reducer = cohort_test::world_size() > 1;  // none on one rank: nothing to ask
        for (auto const& v : r.return_values) {
          bool const started = v["started_on_thread"].get<bool>();
          CHECK(v["close"] == true);
          CHECK(v["asked"] == (reducer && !started ? 1 : 0));
          CHECK(v["on_thread"] == (reducer && (started || every_rank)));
        }
      }
    }
  }
}

TEST_CASE("equivalence holds with buckets large enough for the ring all-reduce", "[torch][equivalence][mpi]") {
  // hidden 192, float64: a 288 KiB layer, above comm::mpi's ring threshold (32 KiB per rank) at 1-4 ranks.
  auto r = cohort::trainer{[](cohort::context& ctx) {
             return train_and_compare(ctx, true, false, cohort::reduce_on::automatic, 192);
           }}.fit(nlohmann::json::object(), quiet("ring"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) CHECK(v["close"] == true);
}

TEST_CASE("equivalence holds with gradient accumulation under no_sync", "[torch][equivalence][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) { return train_and_compare(ctx, true); }}.fit(
      nlohmann::json::object(), quiet("accumulate"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) CHECK(v["close"] == true);
}

TEST_CASE("equivalence holds when gradients are reset to none between steps, accumulating into the buckets",
          "[torch][equivalence][mpi]") {
  for (bool accumulate : {false, true}) {
    auto r = cohort::trainer{[&](cohort::context& ctx) { return train_and_compare(ctx, accumulate, true); }}.fit(
        nlohmann::json::object(), quiet("set_to_none"));
    REQUIRE(r.ok());
    REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
    for (auto const& v : r.return_values) {
      CHECK(v["close"] == true);
      CHECK(v["in_place"] == true);  // a .grad allocated per step (and copied into its bucket) fails this
    }
  }
}

TEST_CASE("prepare_model broadcasts parameters and buffers from rank 0", "[torch][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) {
             auto bn = torch::nn::BatchNorm1d(3);
             {
               // Every rank starts from other values (BatchNorm's own are ones and zeros on every
               // rank, whatever the seed, so they would match without any broadcast).
               torch::NoGradGuard no_grad;
               float const r = static_cast<float>(ctx.world_rank());
               bn->weight.fill_(r + 2);
               bn->bias.fill_(-(r + 1));
               bn->running_mean.fill_(r + 1);
             }
             auto model = ctx.prepare_model(bn);
             return nlohmann::json{{"mean", model->running_mean[0].item<double>()},
                                   {"weight", model->weight.sum().item<double>()},
                                   {"bias", model->bias.sum().item<double>()}};
           }}.fit(nlohmann::json::object(), quiet("broadcast"));
  REQUIRE(r.ok());
  // Rank 0's values everywhere: catches a broadcast that skips parameters or buffers, or sends
  // from another rank.
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    CHECK(v["mean"] == 1.0);
    CHECK(v["weight"] == 6.0);
    CHECK(v["bias"] == -3.0);
  }
}

TEST_CASE("a model layout that differs on one rank is an error on every rank, not a hang", "[torch][mpi][bad-input]") {
  int const odd = cohort_test::world_size() - 1;
  auto r = cohort::trainer{[&](cohort::context& ctx) {
             auto model = ctx.prepare_model(mlp(ctx.world_rank() == odd && odd > 0 ? 9 : 8));
             torch::mse_loss(model(inputs(2)), targets(inputs(2))).backward();
           }}.fit(nlohmann::json::object(), quiet("layout"));
  if (cohort_test::world_size() == 1) {
    CHECK(r.ok());
    return;
  }
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("model layout differs"));
  CHECK_THAT(*r.error, contains_text("on rank " + std::to_string(odd)));
  CHECK_THAT(*r.error, contains_text("'l1.weight' [9, 4]"));
}

TEST_CASE("bfloat16 and float16 gradient compression average gradients to that precision, identically on every rank", "[torch][mpi]") {
  auto const compression = GENERATE(cohort::gradient_compression::bfloat16, cohort::gradient_compression::float16);
  // Significant bits kept: a relative error of 2^-bits per rounding, a few roundings.
  double const bits = compression == cohort::gradient_compression::bfloat16 ? 8 : 11;
  auto r = cohort::trainer{[compression, bits](cohort::context& ctx) {
             torch::manual_seed(3);
             mlp net(16);
             mlp plain(16);  // the same parameters (broadcast below), no reducer: the full-precision reference
             auto model = ctx.prepare_model(net, {.bucket_cap_bytes = 256, .first_bucket_cap_bytes = 64,
                                                  .compression = compression});
             {
               torch::NoGradGuard no_grad;
               for (std::size_t i = 0; i < plain->parameters().size(); ++i) plain->parameters()[i].copy_(model->parameters()[i]);
             }
             auto x = inputs(8 * ctx.world_size()).narrow(0, 8 * ctx.world_rank(), 8) * (1 + ctx.world_rank());
             torch::mse_loss(model(x), targets(x)).backward();
             torch::mse_loss(plain(x), targets(x)).backward();
             bool within = true, rounded = false, same_everywhere = true;
             MPI_Comm const ranks = ctx.comm().target<cohort::comm::mpi>()->native();
             for (std::size_t i = 0; i < plain->parameters().size(); ++i) {
               if (!plain->parameters()[i].grad().defined()) continue;  // the unused layer
               auto g = model->parameters()[i].grad().contiguous();
               // The reference average by raw MPI in float64, not by cohort's own all-reduce.
               auto ref = plain->parameters()[i].grad().to(torch::kDouble).contiguous();
               MPI_Allreduce(MPI_IN_PLACE, ref.data_ptr<double>(), static_cast<int>(ref.numel()), MPI_DOUBLE, MPI_SUM, ranks);
               ref /= ctx.world_size();
               auto tol = 4.0 * std::exp2(-bits) * ref.abs().max().item<double>() + 1e-12;
               within = within && ((g.to(torch::kDouble) - ref).abs() <= tol).all().item<bool>();
               rounded = rounded || !torch::equal(g, ref.to(torch::kFloat));
               auto hi = g.clone(), lo = g.clone();
               MPI_Allreduce(MPI_IN_PLACE, hi.data_ptr<float>(), static_cast<int>(hi.numel()), MPI_FLOAT, MPI_MAX, ranks);
               MPI_Allreduce(MPI_IN_PLACE, lo.data_ptr<float>(), static_cast<int>(lo.numel()), MPI_FLOAT, MPI_MIN, ranks);
               same_everywhere = same_everywhere && torch::equal(hi, lo);
             }
             return nlohmann::json{{"within", within}, {"rounded", rounded}, {"same", same_everywhere}};
           }}.fit(nlohmann::json::object(), quiet(bits == 8 ? "compression_bf16" : "compression_fp16"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    CHECK(v["within"] == true);
    CHECK(v["same"] == true);
    if (cohort_test::world_size() > 1) CHECK(v["rounded"] == true);  // compressed: not the float32 average
  }
}

TEST_CASE("grad_scaler skips the steps whose scaled gradients overflow, backs off, and training recovers", "[torch][mpi]") {
  // Catches: a step taken with inf/NaN gradients (the parameters turn NaN), a scale that never
  // backs off (every step skipped) or never grows, gradients left scaled at the step, ranks that
  // disagree on a skip. A scale of 1e60 overflows float32 at once; backing off by 1e-10 a step,
  // the first three steps (1e60, 1e50, 1e40) are skipped and the fourth (1e30) is taken.
  auto r = cohort::trainer{[](cohort::context& ctx) {
             torch::manual_seed(5);
             auto model = ctx.prepare_model(mlp(8));
             torch::optim::SGD opt(model->parameters(), 0.1);
             cohort::grad_scaler scaler({.init_scale = 1e60, .backoff_factor = 1e-10, .growth_interval = 5});
             auto x = inputs(16 * ctx.world_size()).narrow(0, 16 * ctx.world_rank(), 16);
             auto y = targets(x);
             auto const initial = flat_params(*model);
             bool unchanged_while_skipping = true, grads_unscaled = true;
             std::vector<double> scales;
             for (int step = 0; step < 60; ++step) {
               opt.zero_grad();
               auto loss = torch::mse_loss(model(x), y);
               scaler.scale(loss).backward();
               scaler.unscale(opt);  // before reading gradients, as before clipping
               for (auto const& p : model->parameters())
                 if (p.grad().defined() && step >= 3) grads_unscaled = grads_unscaled && p.grad().abs().max().item<double>() < 10;
               bool const stepped = scaler.step(opt);
               if (step < 3) unchanged_while_skipping = unchanged_while_skipping && !stepped && close(flat_params(*model), initial, 0);
               scaler.update();
               scales.push_back(scaler.current_scale());
             }
             bool finite = true;
             for (auto const& p : model->parameters()) finite = finite && torch::isfinite(p).all().item<bool>();
             // The 57 steps taken are plain SGD's on the global batch, in one process, unscaled.
             torch::manual_seed(5);
             mlp reference(8);
             torch::optim::SGD ref_opt(reference->parameters(), 0.1);
             auto const gx = inputs(16 * ctx.world_size());
             for (int step = 0; step < 57; ++step) {
               ref_opt.zero_grad();
               torch::mse_loss(reference(gx), targets(gx)).backward();
               ref_opt.step();
             }
             return nlohmann::json{{"skipped", scaler.skipped_steps()}, {"unchanged", unchanged_while_skipping},
                                   {"unscaled", grads_unscaled}, {"finite", finite}, {"as_plain_sgd", close(flat_params(*model), flat_params(*reference), 1e-4)},
                                   {"scales", scales}, {"state", scaler.state()}};
           }}.fit(nlohmann::json::object(), quiet("grad_scaler"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    CHECK(v["skipped"] == 3);
    CHECK(v["unchanged"] == true);
    CHECK(v["unscaled"] == true);
    CHECK(v["finite"] == true);
    CHECK(v["as_plain_sgd"] == true);  // after the overflow it trained as it would have unscaled
    auto const& s = v["scales"];
    CHECK_THAT(s[0].get<double>(), Catch::Matchers::WithinRel(1e50));
    CHECK_THAT(s[2].get<double>(), Catch::Matchers::WithinRel(1e30));
    CHECK_THAT(s[6].get<double>(), Catch::Matchers::WithinRel(1e30));  // four good steps: not yet
    CHECK_THAT(s[7].get<double>(), Catch::Matchers::WithinRel(2e30));  // the fifth: grown
    CHECK(v["state"]["growth_tracker"] == (60 - 3) % 5);
    CHECK(v["scales"] == r.return_values.front()["scales"]);  // every rank skipped the same steps
  }
  cohort::grad_scaler restored;
  restored.load_state(r.return_values.front()["state"]);
  CHECK(restored.current_scale() == r.return_values.front()["scales"].back().get<double>());
  CHECK_THROWS_WITH(restored.load_state({{"scale", -1}, {"growth_tracker", 0}}), contains_text("grad_scaler::load_state: expected"));
  CHECK_THROWS_WITH(cohort::grad_scaler({.backoff_factor = 2}), contains_text(".backoff_factor must be between 0 and 1"));
  CHECK_THROWS_WITH(cohort::grad_scaler({.init_scale = 0}), contains_text(".init_scale must be positive"));
}

TEST_CASE("autocast runs the forward in bfloat16 while parameters and averaged gradients stay float32", "[torch][mpi]") {
  auto r = cohort::trainer{[](cohort::context& ctx) {
             torch::manual_seed(3);
             auto model = ctx.prepare_model(mlp(16));
             auto x = inputs(8 * ctx.world_size()).narrow(0, 8 * ctx.world_rank(), 8);
             torch::Tensor out, loss;
             {
               cohort::autocast mixed{ctx.device()};
               out = model(x);
               {
                 cohort::autocast nested{ctx.device()};  // nests: the outer scope stays on
               }
               loss = torch::mse_loss(out.to(torch::kFloat), targets(x));
             }
             auto after = model(x);  // autocast is off again
             loss.backward();
             bool grads_float = true;
             for (auto const& p : model->parameters())
               if (p.grad().defined())  // the unused layer has none on one rank (no reducer)
                 grads_float = grads_float && p.grad().scalar_type() == torch::kFloat;
             return nlohmann::json{{"inside", std::string(c10::toString(out.scalar_type()))},
                                   {"after", std::string(c10::toString(after.scalar_type()))},
                                   {"grads_float", grads_float},
                                   {"param", std::string(c10::toString(model->parameters()[0].scalar_type()))}};
           }}.fit(nlohmann::json::object(), quiet("autocast"));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : r.return_values) {
    CHECK(v["inside"] == "BFloat16");
    CHECK(v["after"] == "Float");
    CHECK(v["grads_float"] == true);
    CHECK(v["param"] == "Float");
  }
  CHECK_THROWS_WITH(cohort::autocast(cohort::device{}, torch::kHalf), contains_text("float16 autocast on the CPU is not supported"));
  CHECK_THROWS_WITH(cohort::autocast(cohort::device{}, torch::kFloat), contains_text("is not a reduced precision"));
}
