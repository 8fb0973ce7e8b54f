#include <cohort/tuning/search_space.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../catch.hpp"

using nlohmann::json;

namespace {

std::vector<json> draw(cohort::domain const& d, int n, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<json> out;
  for (int i = 0; i < n; ++i) out.push_back(d.sample(rng, json::object()));
  return out;
}

}  // namespace

namespace search_space_test {

struct user_config {
  double lr = 0;
  int batch_size = 0;
  int epochs = 0;
  std::string activation{};
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(user_config, lr, batch_size, epochs, activation)

}  // namespace search_space_test

TEST_CASE("a space samples constants, nested keys and distributions into one nested config", "[tuning][pure]") {
  cohort::space sp{{"lr", cohort::loguniform(1e-4, 1e-1)},
                   {"batch_size", cohort::choice({32, 64, 128})},
                   {"epochs", 3},
                   {"activation", "relu"},
                   {"optimizer/momentum", cohort::uniform(0.8, 0.99)},
                   {"optimizer/name", "sgd"}};
  CHECK(sp.size() == 6);
  CHECK(sp.grid_size() == 1);
  std::mt19937_64 rng(7);
  auto c = cohort::tuning::sample_config(sp, rng);
  CHECK(c["epochs"] == 3);
  CHECK(c["epochs"].is_number_integer());
  CHECK(c["activation"] == "relu");
  CHECK(c["optimizer"]["name"] == "sgd");
  CHECK(c["optimizer"]["momentum"].get<double>() >= 0.8);
  CHECK(c["optimizer"]["momentum"].get<double>() <= 0.99);
  CHECK(c["lr"].is_number_float());
  CHECK(std::set<int>{32, 64, 128}.count(c["batch_size"].get<int>()) == 1);

  auto flat = sp.flatten(c);
  CHECK(flat.size() == 6);
  CHECK(flat["optimizer/name"] == "sgd");
  CHECK(sp.materialize(flat) == c);
  CHECK(*cohort::tuning::lookup(c, "optimizer/momentum") == c["optimizer"]["momentum"]);
  CHECK(cohort::tuning::lookup(c, "optimizer/missing") == nullptr);
  CHECK(cohort::tuning::lookup(c, "epochs/x") == nullptr);

  auto printed = sp.to_json();
  CHECK(printed["lr"] == "loguniform(0.0001, 0.1)");
  CHECK(printed["epochs"] == 3);
  CHECK(sp.describe().rfind("lr: loguniform(0.0001, 0.1), batch_size: choice([32, 64, 128]), epochs: 3", 0) == 0);
}

TEST_CASE("a sampled config converts to the user's struct", "[tuning][pure]") {
  cohort::space sp{{"lr", cohort::loguniform(1e-4, 1e-1)},
                   {"batch_size", cohort::qrandint(16, 128, 16)},
                   {"epochs", cohort::randint(1, 5)},
                   {"activation", cohort::choice({"relu", "tanh"})}};
  std::mt19937_64 rng(3);
  auto const config = cohort::tuning::sample_config(sp, rng);
  auto cfg = config.get<search_space_test::user_config>();
  CHECK(json(cfg) == config);
  CHECK(cfg.lr >= 1e-4);
  CHECK(cfg.lr <= 1e-1);
  CHECK(cfg.batch_size % 16 == 0);
  CHECK(cfg.epochs >= 1);
  CHECK(cfg.epochs <= 4);
  CHECK((cfg.activation == "relu" || cfg.activation == "tanh"));
}

TEST_CASE("uniform, loguniform and quantized floats stay in range with the right shape", "[tuning][pure]") {
  auto u = draw(cohort::uniform(-2, 3), 4000);
  double sum = 0;
  for (auto const& v : u) {
    REQUIRE(v.is_number_float());
    CHECK(v.get<double>() >= -2);
    CHECK(v.get<double>() <= 3);
    sum += v.get<double>();
  }
  CHECK(sum / 4000 == Approx(0.5).margin(0.1));

  // log-uniform: the median is near the geometric mean, and each decade gets a quarter
  auto l = draw(cohort::loguniform(1e-5, 1e-1), 4000);
  std::vector<double> xs;
  std::map<int, int> per_decade;
  for (auto const& v : l) {
    double const x = v.get<double>();
    CHECK(x >= 1e-5);
    CHECK(x <= 1e-1);
    xs.push_back(x);
    ++per_decade[static_cast<int>(std::floor(std::log10(x)))];
  }
  std::nth_element(xs.begin(), xs.begin() + 2000, xs.end());
  CHECK(std::log10(xs[2000]) == Approx(-3).margin(0.1));
  for (int d = -5; d <= -2; ++d) CHECK(per_decade[d] == Approx(1000).margin(120));

  // quniform: multiples of q, both ends reachable, the ends half as likely (Ray rounds a uniform draw)
  std::map<long, int> counts;
  for (auto const& v : draw(cohort::quniform(0, 1, 0.25), 4000)) {
    REQUIRE(v.is_number_float());
    double const k = v.get<double>() / 0.25;
    CHECK(std::fabs(k - std::round(k)) < 1e-9);
    ++counts[std::lround(k)];
  }
  CHECK(counts.size() == 5);
  CHECK(counts[0] == Approx(500).margin(100));
  CHECK(counts[2] == Approx(1000).margin(120));
  CHECK(counts[4] == Approx(500).margin(100));

  for (auto const& v : draw(cohort::qloguniform(1e-4, 1e-1, 5e-5), 1000)) {
    double const x = v.get<double>(), k = x / 5e-5;
    CHECK(std::fabs(k - std::round(k)) < 1e-6);
    CHECK(x >= 1e-4 - 1e-12);
    CHECK(x <= 1e-1 + 1e-12);
  }
  for (auto const& v : draw(cohort::qrandn(0, 2, 0.5), 500)) {
    REQUIRE(v.is_number_float());
    CHECK(std::fmod(std::fabs(v.get<double>()), 0.5) == 0.0);
  }
}

TEST_CASE("integer domains give JSON integers: randint excludes high, qrandint includes it", "[tuning][pure]") {
  std::set<long> seen;
  for (auto const& v : draw(cohort::randint(2, 6), 2000)) {
    REQUIRE(v.is_number_integer());
    seen.insert(v.get<long>());
  }
  CHECK(seen == std::set<long>{2, 3, 4, 5});

  seen.clear();
  for (auto const& v : draw(cohort::qrandint(0, 20, 5), 2000)) {
    REQUIRE(v.is_number_integer());
    seen.insert(v.get<long>());
  }
  CHECK(seen == std::set<long>{0, 5, 10, 15, 20});

  seen.clear();
  for (auto const& v : draw(cohort::qrandint(1, 10), 2000)) seen.insert(v.get<long>());
  CHECK(seen.size() == 10);
  CHECK(*seen.rbegin() == 10);

  seen.clear();  // bounds that are not multiples of q: the multiples inside
  for (auto const& v : draw(cohort::qrandint(-7, 7, 3), 2000)) seen.insert(v.get<long>());
  CHECK(seen == std::set<long>{-6, -3, 0, 3, 6});
}

TEST_CASE("lograndint and qlograndint draw integers log-uniformly: each decade alike", "[tuning][pure]") {
  // lograndint(1, 1000) = floor(10^(3u)): each of [1, 10), [10, 100), [100, 1000) has chance 1/3.
  int decade[3] = {0, 0, 0};
  auto const n = 6000;
  for (auto const& v : draw(cohort::lograndint(1, 1000), n)) {
    REQUIRE(v.is_number_integer());
    auto const x = v.get<long>();
    REQUIRE(x >= 1);
    REQUIRE(x <= 999);  // high is exclusive
    ++decade[x < 10 ? 0 : x < 100 ? 1 : 2];
  }
  for (int c : decade) CHECK(std::abs(c / double(n) - 1.0 / 3) < 0.03);  // 5 standard deviations: 0.0304

  // qlograndint(10, 1000, 10): 10 * 10^(2u) rounded to a multiple of 10. A value <= 100 when the
  // draw is below 105: chance log(10.5) / log(100) = 0.5106. 1000 (high) is reachable.
  std::set<long> seen;
  int low = 0;
  for (auto const& v : draw(cohort::qlograndint(10, 1000, 10), n)) {
    REQUIRE(v.is_number_integer());
    auto const x = v.get<long>();
    REQUIRE(x % 10 == 0);
    REQUIRE(x >= 10);
    REQUIRE(x <= 1000);
    low += x <= 100;
    seen.insert(x);
  }
  CHECK(std::abs(low / double(n) - 0.5106) < 0.03);
  CHECK(seen.count(1000) == 1);
  CHECK(seen.count(10) == 1);

  auto d = cohort::qlograndint(16, 512, 16);
  CHECK(d.is_log());
  CHECK(d.is_integer());
  CHECK(d.quantum() == 16.0);
  CHECK(d.clamp_and_round(1000) == 512);
  CHECK(d.clamp_and_round(1) == 16);
  CHECK(d.clamp_and_round(40) == 32);  // 2.5 rounds half to even
  CHECK(cohort::lograndint(2, 64).quantum() == 1.0);
  CHECK(cohort::lograndint(2, 64).clamp_and_round(64) == 63);
  CHECK(cohort::lograndint(2, 64).describe() == "lograndint(2, 64)");
  CHECK(d.describe() == "qlograndint(16, 512, 16)");
  CHECK_THROWS_WITH(cohort::lograndint(0, 10), contains_text("lograndint(0, 10): low must be > 0 for a log scale"));
  CHECK_THROWS_WITH(cohort::lograndint(5, 5), contains_text("lograndint(5, 6) always gives 5"));
  CHECK_THROWS_WITH(cohort::qlograndint(-4, 10, 2), contains_text("low must be > 0"));
  CHECK_THROWS_WITH(cohort::qlograndint(5, 7, 4), contains_text("no multiple of q"));
}

TEST_CASE("randn draws have the requested mean and standard deviation", "[tuning][pure]") {
  auto v = draw(cohort::randn(3, 2), 20000);
  double sum = 0, sq = 0;
  for (auto const& x : v) {
    REQUIRE(x.is_number_float());
    sum += x.get<double>();
    sq += x.get<double>() * x.get<double>();
  }
  double const mean = sum / 20000, sd = std::sqrt(sq / 20000 - mean * mean);
  CHECK(mean == Approx(3).margin(0.06));
  CHECK(sd == Approx(2).margin(0.06));
}

TEST_CASE("choice draws every value and sample_from sees the keys sampled before it", "[tuning][pure]") {
  std::set<std::string> names;
  for (auto const& v : draw(cohort::choice({"a", "b", "c"}), 300)) names.insert(v.get<std::string>());
  CHECK(names == std::set<std::string>{"a", "b", "c"});

  cohort::space sp{{"width", cohort::randint(1, 100)},
                   {"double_width", cohort::sample_from([](json const& c) { return c["width"].get<int>() * 2; })},
                   {"model/depth", cohort::randint(1, 10)},
                   {"total", cohort::sample_from([](json const& c) {
                      return c["double_width"].get<int>() + c["model"]["depth"].get<int>() + c["bias"].get<int>();
                    })},
                   {"noisy", cohort::sample_from([](json const& c, std::mt19937_64& rng) {
                      return c["width"].get<int>() + static_cast<int>(rng() % 2);
                    })},
                   {"bias", 1000}};
  std::mt19937_64 rng(11);
  for (int i = 0; i < 50; ++i) {
    auto c = cohort::tuning::sample_config(sp, rng);
    CHECK(c["double_width"] == 2 * c["width"].get<int>());
    CHECK(c["total"] == c["double_width"].get<int>() + c["model"]["depth"].get<int>() + 1000);
    CHECK(c["noisy"].get<int>() - c["width"].get<int>() <= 1);
  }
}

TEST_CASE("the same engine state draws the same configs", "[tuning][pure]") {
  cohort::space sp{{"x", cohort::uniform(0, 1)}, {"n", cohort::randint(0, 1000)}, {"z", cohort::randn()}};
  std::mt19937_64 a(5), b(5), c(6);
  auto first = cohort::tuning::sample_config(sp, a);
  CHECK(first == cohort::tuning::sample_config(sp, b));
  CHECK(first != cohort::tuning::sample_config(sp, c));
}

TEST_CASE("clamp_and_round puts perturbed values back into the domain", "[tuning][pure]") {
  CHECK(cohort::uniform(0, 1).clamp_and_round(1.2) == 1.0);
  CHECK(cohort::uniform(0, 1).clamp_and_round(-3).is_number_float());
  CHECK(cohort::loguniform(1e-4, 1e-1).clamp_and_round(0.12) == 0.1);
  CHECK(cohort::loguniform(1e-4, 1e-1).clamp_and_round(1e-3) == 1e-3);
  CHECK(cohort::quniform(0, 1, 0.25).clamp_and_round(0.6).get<double>() == Approx(0.5));
  CHECK(cohort::quniform(0, 1, 0.25).clamp_and_round(7).get<double>() == Approx(1.0));
  auto r = cohort::randint(1, 10).clamp_and_round(12.4);
  CHECK(r.is_number_integer());
  CHECK(r == 9);  // high is exclusive
  CHECK(cohort::randint(1, 10).clamp_and_round(4.6) == 5);
  CHECK(cohort::qrandint(16, 128, 16).clamp_and_round(40) == 32);  // 40 / 16 = 2.5 rounds half to even, as NumPy
  CHECK(cohort::qrandint(16, 128, 16).clamp_and_round(41) == 48);
  CHECK(cohort::qrandint(16, 128, 16).clamp_and_round(1000) == 128);
  CHECK(cohort::randn(0, 1).clamp_and_round(17.5) == 17.5);
  CHECK(cohort::qrandn(0, 1, 0.5).clamp_and_round(1.3) == 1.5);

  auto d = cohort::qloguniform(1e-4, 1e-1, 1e-4);
  CHECK(d.is_log());
  CHECK(d.is_numeric());
  CHECK_FALSE(d.is_integer());
  CHECK(d.low() == 1e-4);
  CHECK(d.high() == 1e-1);
  CHECK(d.quantum() == 1e-4);
  CHECK(cohort::randint(0, 3).quantum() == 1.0);
  CHECK(cohort::randint(0, 3).is_integer());
  CHECK_FALSE(cohort::uniform(0, 3).quantum().has_value());
  CHECK(cohort::randn(0, 1).low() == -std::numeric_limits<double>::infinity());

  CHECK_THROWS_WITH(cohort::choice({1, 2}).clamp_and_round(1), contains_text("only defined for numeric domains"));
  CHECK_THROWS_WITH(cohort::choice({1, 2}).low(), contains_text("choice([1, 2]): low()"));
}

TEST_CASE("domains describe themselves the way they were written", "[tuning][pure]") {
  CHECK(cohort::loguniform(0.0001, 0.1).describe() == "loguniform(0.0001, 0.1)");
  CHECK(cohort::loguniform(1e-5, 1).describe() == "loguniform(1e-05, 1)");
  CHECK(cohort::uniform(-2, 2).describe() == "uniform(-2, 2)");
  CHECK(cohort::quniform(0, 1, 0.1).describe() == "quniform(0, 1, 0.1)");
  CHECK(cohort::randint(1, 10).describe() == "randint(1, 10)");
  CHECK(cohort::qrandint(0, 100, 5).describe() == "qrandint(0, 100, 5)");
  CHECK(cohort::randn().describe() == "randn(0, 1)");
  CHECK(cohort::choice({32, 64}).describe() == "choice([32, 64])");
  CHECK(cohort::grid_search({"a", "b"}).describe() == "grid_search([\"a\", \"b\"])");
  CHECK(cohort::domain(3).describe() == "3");
  CHECK(cohort::sample_from([](json const&) { return 1; }).describe() == "sample_from(<function>)");
}

TEST_CASE("grid values are not sampled: a searcher expands them", "[tuning][pure]") {
  auto g = cohort::grid_search({1, 2, 3});
  CHECK(g.is_grid());
  CHECK(g.values().size() == 3);
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(g.sample(rng, json::object()), contains_text("grid values into one trial each"));
  cohort::space sp{{"a", cohort::grid_search({1, 2, 3})}, {"b", cohort::grid_search({"x", "y"})}, {"c", 1}};
  CHECK(sp.grid_size() == 6);
  CHECK_THROWS_WITH(cohort::tuning::sample_config(sp, rng), contains_text("\"a\" is grid_search([1, 2, 3])"));
}

TEST_CASE("bad domains and spaces fail when built, with one clear line", "[tuning][pure]") {
  CHECK_THROWS_WITH(cohort::choice({}), contains_text("choice() needs at least one value"));
  CHECK_THROWS_WITH(cohort::grid_search({}), contains_text("grid_search() needs at least one value"));
  CHECK_THROWS_WITH(cohort::uniform(2, 1), contains_text("uniform(2, 1): low > high"));
  CHECK_NOTHROW(cohort::uniform(1, 1));
  CHECK_THROWS_WITH(cohort::loguniform(0, 1), contains_text("loguniform(0, 1): bounds must be > 0 for a log scale"));
  CHECK_THROWS_WITH(cohort::qloguniform(-1, 1, 0.5), contains_text("bounds must be > 0 for a log scale"));
  CHECK_THROWS_WITH(cohort::quniform(0, 1, 0), contains_text("quniform(0, 1, 0): q must be > 0"));
  CHECK_THROWS_WITH(cohort::quniform(0.05, 1, 0.1), contains_text("must be multiples of q"));
  CHECK_THROWS_WITH(cohort::qrandint(0, 10, -2), contains_text("q must be > 0"));
  CHECK_THROWS_WITH(cohort::qrandint(3, 4, 5), contains_text("no multiple of q"));
  CHECK_THROWS_WITH(cohort::randint(5, 5), contains_text("randint(5, 5): needs low < high, high is exclusive"));
  CHECK_THROWS_WITH(cohort::randn(0, 0), contains_text("randn(0, 0): sd must be > 0"));
  CHECK_THROWS_WITH(cohort::qrandn(0, 1, 0), contains_text("q must be > 0"));
  CHECK_THROWS_WITH(cohort::uniform(0, std::numeric_limits<double>::infinity()), contains_text("must be finite"));
  CHECK_THROWS_WITH(cohort::sample_from(std::function<json(json const&)>{}),
                    contains_text("sample_from() needs a callable"));

  CHECK_THROWS_WITH((cohort::space{{"lr", 0.1}, {"lr", 0.2}}), contains_text("space: duplicate key \"lr\""));
  CHECK_THROWS_WITH((cohort::space{{"opt", "sgd"}, {"opt/lr", 0.2}}), contains_text("overlap"));
  CHECK_THROWS_WITH((cohort::space{{"opt//lr", 0.2}}), contains_text("bad key"));
  CHECK_THROWS_WITH((cohort::space{{"", 0.2}}), contains_text("bad key"));
}

TEST_CASE("integer domains as wide as int64 sample and clamp inside their bounds", "[tuning][pure][bad-input]") {
  auto const lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  for (auto const& v : draw(cohort::randint(lo, hi), 200)) {
    REQUIRE(v.is_number_integer());
    CHECK(v.get<std::int64_t>() < hi);
  }
  for (auto const& v : draw(cohort::qrandint(lo, hi, 1), 200)) REQUIRE(v.is_number_integer());
  for (auto const& v : draw(cohort::qrandint(0, hi, hi), 200)) CHECK((v == 0 || v == hi));
  CHECK(cohort::randint(lo, hi).clamp_and_round(1e300) == hi - 1);
  CHECK(cohort::randint(lo, hi).clamp_and_round(-1e300) == lo);
  CHECK(cohort::qrandint(0, hi, hi).clamp_and_round(1e300) == hi);
  CHECK(cohort::qrandint(lo, 0, 3).clamp_and_round(-1e300) == lo / 3 * 3);
  CHECK_THROWS_WITH(cohort::randint(hi, hi), contains_text("needs low < high"));
}
