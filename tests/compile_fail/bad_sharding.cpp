// Must fail to compile: a sharding policy's indices() must return std::vector<std::size_t>.
#include <cohort/concepts.hpp>

struct broken_sharding {
  std::vector<int> indices(std::size_t, int, int, std::int64_t) const { return {}; }
};
static_assert(cohort::sharding_policy<broken_sharding>, "broken_sharding must satisfy cohort::sharding_policy");

int main() {}
