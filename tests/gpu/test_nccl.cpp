// comm::nccl on the GPU: collectives on device buffers, requests, groups, split, and
// scaling::cuda's placement, one rank per GPU (gpu.1ranks, gpu.2ranks where two GPUs are seen).
// Every rank contributes different values, so at 2 ranks a collective that did nothing fails; at
// 1 rank (where a reduction is the identity) the tests show what one rank can: the collective is
// enqueued on the stream set, behind the work already there, and one that cannot complete is an
// error within its deadline, after which the communicator refuses further calls.
#include <cohort/comm/nccl.hpp>
#include <cohort/scaling/cuda.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
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

/// The world's NCCL communicator on this rank's device (gpu_main.cpp made it the current one).
cohort::comm::nccl world_nccl(int timeout_ms = 60'000) {
  int device = 0;
  cudaGetDevice(&device);
  return cohort::comm::nccl(cohort::comm::mpi::world(), device, {.timeout_ms = timeout_ms});
}

/// Holds a CUDA stream: work enqueued behind it waits until release(). The destructor releases it
/// and waits for the stream, so the flag the host function reads outlives it.
struct stream_gate {
  explicit stream_gate(cudaStream_t s) : stream(s) {
    REQUIRE(cudaLaunchHostFunc(s, [](void* open) { while (!static_cast<std::atomic<bool>*>(open)->load()) {} }, &open) == cudaSuccess);
  }
  stream_gate(stream_gate const&) = delete;
  stream_gate& operator=(stream_gate const&) = delete;
  ~stream_gate() {
    release();
    cudaStreamSynchronize(stream);
  }
  void release() { open = true; }
  cudaStream_t stream;
  std::atomic<bool> open{false};
};

}  // namespace

TEST_CASE("NCCL all-reduce sums device buffers in place, in stream order", "[gpu][nccl]") {
  auto c = world_nccl();
  float const n = static_cast<float>(c.size());
  // Rank r holds (r + 1) * i: the sum over ranks is i * n (n + 1) / 2.
  std::vector<float> values(1 << 20);
  std::iota(values.begin(), values.end(), 0.0f);
  std::vector<float> mine(values);
  for (auto& v : mine) v *= static_cast<float>(c.rank() + 1);
  device_buffer<float> buf(mine);
  c.allreduce(buf.ptr, buf.n, cohort::comm::reduce_op::sum);
  auto got = buf.host();
  for (std::size_t i = 0; i < values.size(); i += 4099) CHECK(got[i] == values[i] * n * (n + 1) / 2);

  std::int64_t const r = c.rank(), size = c.size();
  device_buffer<std::int64_t> ints(std::vector<std::int64_t>{3 + r, -1 - r, 7 * (r + 1)});
  auto req = c.iallreduce(ints.ptr, ints.n, cohort::comm::reduce_op::max);
  req.wait();
  CHECK(req.test());
  CHECK(ints.host() == std::vector<std::int64_t>{3 + size - 1, -1, 7 * size});
}

TEST_CASE("an NCCL collective is enqueued on the stream set, behind the work already there", "[gpu][nccl]") {
  auto c = world_nccl();
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  c.set_stream(s);
  device_buffer<float> buf(std::vector<float>(256, 1.0f));
  device_buffer<float> fives(std::vector<float>(256, 5.0f));
  {
    stream_gate gate(s);
    // Behind the gate: the copy of 5s, then the all-reduce. A collective run at once, on the host
    // or on another stream, would sum the 1s, or be complete before the gate opens. (At 1 rank
    // NCCL's in-place sum launches nothing, so there this shows the request's event is ordered
    // on the stream; at 2 ranks it shows the collective itself is.) A device-to-device copy: a
    // pageable host copy may wait for the held stream on this very thread.
    REQUIRE(cudaMemcpyAsync(buf.ptr, fives.ptr, buf.n * sizeof(float), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    auto req = c.iallreduce(buf.ptr, buf.n, cohort::comm::reduce_op::sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(req.test());
    gate.release();
    req.wait();
    CHECK(req.test());
  }
  auto got = buf.host();
  CHECK(got[0] == 5.0f * static_cast<float>(c.size()));
  CHECK(got[255] == 5.0f * static_cast<float>(c.size()));
  c.set_stream(nullptr);
  cudaStreamDestroy(s);
}

TEST_CASE("an NCCL collective that cannot complete is an error within its deadline, and the communicator then refuses calls", "[gpu][nccl]") {
  auto c = world_nccl(300);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  c.set_stream(s);
  device_buffer<float> buf(std::vector<float>(16, 1.0f));
  auto gate = std::make_unique<stream_gate>(s);  // the collective cannot start: as if a peer never came
  // Opened after 1 s whatever happens, so that a wait() that does not give up (the regression this
  // catches) ends with no error and fails below, not a hang; the abort may itself wait for the
  // held stream until then. A jthread: joined (before the gate ends) even if a call throws.
  std::jthread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    gate->release();
  });
  auto const t0 = std::chrono::steady_clock::now();
  auto req = c.iallreduce(buf.ptr, buf.n, cohort::comm::reduce_op::sum);
  std::string message = "no error";
  try {
    req.wait();
  } catch (cohort::error const& e) {
    message = e.what();
  }
  auto const waited = std::chrono::steady_clock::now() - t0;
  opener.join();
  CHECK_THAT(message, contains_text("did not complete within 300 ms"));
  CHECK_THAT(message, contains_text("the NCCL communicator was aborted"));
  CHECK(waited < std::chrono::seconds(4));
  std::string later = "no error";
  try {
    c.allreduce(buf.ptr, buf.n, cohort::comm::reduce_op::sum);
  } catch (cohort::error const& e) {
    later = e.what();
  }
  CHECK_THAT(later, contains_text("this NCCL communicator was aborted"));
  gate.reset();  // waits for the stream: before it is destroyed, not after (a segfault in CUDA)
  c.set_stream(nullptr);
  cudaStreamDestroy(s);
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
  device_buffer<double> v(std::vector<double>{1.5 + c.rank()});
  alone.allreduce(v.ptr, 1, cohort::comm::reduce_op::sum);
  CHECK(v.host()[0] == 1.5 + c.rank());
  // Reversed order (key = -rank): the world's last rank is rank 0 of the split, and a sum over
  // it sees every rank's value.
  auto reversed = c.split(0, -c.rank());
  CHECK(reversed.size() == c.size());
  CHECK(reversed.rank() == c.size() - 1 - c.rank());
  device_buffer<double> w(std::vector<double>{static_cast<double>(c.rank() + 1)});
  reversed.allreduce(w.ptr, 1, cohort::comm::reduce_op::sum);
  CHECK(w.host()[0] == c.size() * (c.size() + 1) / 2.0);
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
