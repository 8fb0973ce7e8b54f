// comm::nccl on the GPU: collectives on device buffers, requests, groups, split, and
// scaling::cuda's placement. One GPU means one rank here (NCCL refuses two ranks on one device);
// the multi-rank logic of the same code is exercised on CPU through comm::mpi.
#include <cohort/comm/nccl.hpp>
#include <cohort/scaling/cuda.hpp>

#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "../catch.hpp"

namespace {

/// A device buffer of `n` T, filled from `host`.
template <class T>
struct device_buffer {
  explicit device_buffer(std::vector<T> const& host) : n(host.size()) {
    cudaMalloc(&ptr, n * sizeof(T));
    cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  ~device_buffer() { cudaFree(ptr); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  T* ptr = nullptr;
  std::size_t n = 0;
};

cohort::comm::nccl world_nccl() { return cohort::comm::nccl(cohort::comm::mpi::world(), 0, {.timeout_ms = 60'000}); }

}  // namespace

TEST_CASE("NCCL all-reduce sums device buffers in place, in stream order", "[gpu][nccl]") {
  auto c = world_nccl();
  std::vector<float> values(1 << 20);
  std::iota(values.begin(), values.end(), 0.0f);
  device_buffer<float> buf(values);
  c.allreduce(buf.ptr, buf.n, cohort::comm::reduce_op::sum);
  auto got = buf.host();
  for (std::size_t i = 0; i < values.size(); i += 4099) CHECK(got[i] == values[i] * static_cast<float>(c.size()));

  device_buffer<std::int64_t> ints(std::vector<std::int64_t>{3, -1, 7});
  auto req = c.iallreduce(ints.ptr, ints.n, cohort::comm::reduce_op::max);
  req.wait();
  CHECK(req.test());
  CHECK(ints.host() == std::vector<std::int64_t>{3, -1, 7});
}

TEST_CASE("NCCL broadcast, all-gather, barrier and grouped calls", "[gpu][nccl]") {
  auto c = world_nccl();
  std::vector<std::uint8_t> bytes(64, static_cast<std::uint8_t>(c.rank() == 0 ? 9 : 1));
  device_buffer<std::uint8_t> b(bytes);
  c.broadcast(reinterpret_cast<std::byte*>(b.ptr), b.n, 0);
  CHECK(b.host() == std::vector<std::uint8_t>(64, 9));

  device_buffer<std::uint8_t> mine(std::vector<std::uint8_t>(16, static_cast<std::uint8_t>(c.rank() + 1)));
  device_buffer<std::uint8_t> all(std::vector<std::uint8_t>(16 * static_cast<std::size_t>(c.size()), 0));
  c.allgather(reinterpret_cast<std::byte const*>(mine.ptr), 16, reinterpret_cast<std::byte*>(all.ptr));
  auto gathered = all.host();
  for (int r = 0; r < c.size(); ++r) CHECK(gathered[static_cast<std::size_t>(r) * 16] == r + 1);

  device_buffer<float> x(std::vector<float>(1000, 1.0f)), y(std::vector<float>(10, 2.0f));
  {
    cohort::comm::nccl::group together;  // two buckets, one launch
    c.allreduce(x.ptr, x.n, cohort::comm::reduce_op::sum);
    c.allreduce(y.ptr, y.n, cohort::comm::reduce_op::sum);
  }
  c.barrier();
  CHECK(x.host()[999] == static_cast<float>(c.size()));
  CHECK(y.host()[9] == 2.0f * static_cast<float>(c.size()));
}

TEST_CASE("a split NCCL communicator has its own ranks", "[gpu][nccl]") {
  auto c = world_nccl();
  auto alone = c.split(c.rank(), 0);
  CHECK(alone.size() == 1);
  CHECK(alone.rank() == 0);
  device_buffer<double> v(std::vector<double>{1.5});
  alone.allreduce(v.ptr, 1, cohort::comm::reduce_op::sum);
  CHECK(v.host()[0] == 1.5);
}

TEST_CASE("scaling::cuda places each local rank on its own visible GPU", "[gpu][scaling]") {
  cohort::scaling::cuda policy;
  int const n = cohort::scaling::visible_cuda_devices();
  REQUIRE(n >= 1);
  cohort::scaling::topology t{};
  t.local_world_size = n;
  t.local_rank = n - 1;
  CHECK_FALSE(policy.placement_error(t, n));
  CHECK(policy.device_for(t).str() == "cuda:" + std::to_string(n - 1));
}
