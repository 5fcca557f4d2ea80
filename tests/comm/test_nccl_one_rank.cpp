// tests/comm: NCCL collectives on one rank (one GPU cannot host two ranks of one NCCL
// communicator): runs where a GPU answers, skips with the reason where none does.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/nccl_collectives.hpp"

namespace {

using spillway::comm::comm_options;
using spillway::comm::communicator;
using spillway::comm::nccl_collectives;

std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) return std::string("no GPU answers: ") + cudaGetErrorString(rc);
  if (count == 0) return "no GPU answers: cudaGetDeviceCount gave 0";
  return {};
}

TEST(NcclOneRank, CollectivesOnTheDevice) {
  if (const auto reason = no_gpu_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto host = communicator::solo();
  nccl_collectives nccl(*host, 0);
  ASSERT_EQ(nccl.size(), 1);
  ASSERT_EQ(nccl.rank(), 0);
  const std::size_t n = 10007;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * 0.37f - 1e8f * static_cast<float>(i % 3);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void *in_mem = nullptr, *out_mem = nullptr, *ws = nullptr;
  ASSERT_EQ(cudaMalloc(&in_mem, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out_mem, n * sizeof(float)), cudaSuccess);
  if (nccl.workspace_bytes(n) > 0) {
    ASSERT_EQ(cudaMalloc(&ws, nccl.workspace_bytes(n)), cudaSuccess);
  }
  auto* d_in = static_cast<float*>(in_mem);
  auto* d_out = static_cast<float*>(out_mem);
  ASSERT_EQ(cudaMemcpy(d_in, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  nccl.reduce_scatter_sum(d_in, d_out, n, ws, stream);
  nccl.all_reduce_sum(d_in, n, ws, stream);
  std::vector<float> out(n), in_place(n);
  nccl.synchronize(stream);  // the wait that ends (Note [NCCL faults]); nothing fails on one rank
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in_place.data(), d_in, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(0, std::memcmp(out.data(), x.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(in_place.data(), x.data(), n * sizeof(float)));
  // All-gather of 3-byte elements, out of place.
  ASSERT_EQ(cudaMemset(d_out, 0, n * sizeof(float)), cudaSuccess);
  nccl.all_gather(d_in, d_out, 1001, 3, stream);
  nccl.synchronize(stream);
  std::vector<unsigned char> gathered(3003);
  ASSERT_EQ(cudaMemcpy(gathered.data(), d_out, gathered.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(0, std::memcmp(gathered.data(), x.data(), gathered.size()));
  cudaFree(ws);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaStreamDestroy(stream);
}

// A stream that does not reach its end within the timeout (here a host function that sleeps,
// standing for a collective that a dead peer holds up) is a comm_error with the communicator
// aborted, and every later call refuses at once instead of waiting (Note [NCCL faults]).
TEST(NcclOneRank, SynchronizeEndsAtTheTimeoutAndFailsForGood) {
  if (const auto reason = no_gpu_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto host = communicator::solo();
  comm_options options;
  options.timeout = std::chrono::milliseconds(20);
  nccl_collectives nccl(*host, 0, options);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(
                stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }, nullptr),
            cudaSuccess);
  try {
    nccl.synchronize(stream);
    ADD_FAILURE() << "synchronize returned before the stream reached its end";
  } catch (const spillway::comm_error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within 20 ms"), std::string::npos) << e.what();
  }
  try {
    nccl.synchronize(stream);
    ADD_FAILURE() << "a failed communicator answered";
  } catch (const spillway::comm_error& e) {
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

}  // namespace
