// Test rig for kernels/: a device (cpu, or cuda where present), a kernel context, a stream,
// and helpers to move vectors in and out of device memory; plus float64 helpers for references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "device/error.hpp"
#include "kernels/context.hpp"
#include "../test_seed.hpp"

namespace spillway::kernels::testing {

/// Workspace every rig binds for its whole life, as a program binds one before training
/// (Note [Workspace] in kernels/context.hpp); large enough for every kernel test's shapes.
inline constexpr std::size_t rig_workspace_bytes = std::size_t{64} << 20;

class rig {
 public:
  explicit rig(std::string_view kind = "cpu")
      : dev_(make_device(kind)), ctx_(std::make_unique<kernel_context>(*dev_)), s_(dev_->create_stream()) {
    workspace_ = dev_->allocate(rig_workspace_bytes);
    ctx_->bind_workspace(workspace_, rig_workspace_bytes);
  }
  ~rig() {
    try {
      dev_->synchronize();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a test that made the device fail has checked it
    }
    for (auto [p, n] : blocks_) dev_->deallocate(p, n);
    dev_->deallocate(workspace_, rig_workspace_bytes);
    dev_->destroy_stream(s_);
    ctx_.reset();
  }
  rig(const rig&) = delete;
  rig& operator=(const rig&) = delete;

  [[nodiscard]] Device& dev() { return *dev_; }
  [[nodiscard]] kernel_context& ctx() { return *ctx_; }
  [[nodiscard]] stream s() const { return s_; }
  void sync() { dev_->synchronize_stream(s_); }
  /// Holds the stream as a long kernel would, until the returned gate is opened (set_value).
  [[nodiscard]] std::promise<void> hold_stream() {
    std::promise<void> gate;
    dev_->launch_kernel(s_, [opened = gate.get_future().share()] { opened.wait(); });
    return gate;
  }

  /// n zeroed elements of device memory, starting `offset` elements into the allocation.
  template <class T>
  T* alloc(std::size_t n, std::size_t offset = 0) {
    const std::size_t bytes = (n + offset) * sizeof(T);
    void* p = dev_->allocate(bytes == 0 ? sizeof(T) : bytes);
    blocks_.emplace_back(p, bytes);
    dev_->memset_async(p, 0, bytes, s_);
    return static_cast<T*>(p) + offset;
  }

  template <class T>
  T* up(const std::vector<T>& h, std::size_t offset = 0) {
    T* d = alloc<T>(h.size(), offset);
    dev_->copy_async(d, h.data(), h.size() * sizeof(T), copy_kind::host_to_device, s_);
    sync();  // h may die before the stream reaches the copy
    return d;
  }

  template <class T>
  std::vector<T> down(const T* d, std::size_t n) {
    std::vector<T> h(n);
    dev_->copy_async(h.data(), d, n * sizeof(T), copy_kind::device_to_host, s_);
    sync();
    return h;
  }

 private:
  std::unique_ptr<Device> dev_;
  std::unique_ptr<kernel_context> ctx_;
  stream s_;
  void* workspace_ = nullptr;
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(static_cast<std::uint32_t>(spillway::test::test_seed(seed)));
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int limit, std::uint32_t seed) {
  std::mt19937 gen(static_cast<std::uint32_t>(spillway::test::test_seed(seed)));
  std::uniform_int_distribution<int> dist(0, limit - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// Expects |got - want| <= abs_tol + rel_tol * |want| element by element; reports the first miss.
template <class A, class B>
void expect_near_all(const std::vector<A>& got, const std::vector<B>& want, double abs_tol,
                     double rel_tol = 0.0, const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    if (!(std::abs(g - w) <= abs_tol + rel_tol * std::abs(w))) {
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
      return;
    }
  }
}

/// Bitwise equality of two float vectors (NaN-safe, -0 distinct from +0).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Central-difference gradient of a float64 scalar function f at x, in every coordinate.
template <class F>
std::vector<double> numeric_gradient(F f, std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

#define SPILLWAY_NEEDS_CUDA()                                              \
  do {                                                                     \
    if (!::spillway::cuda_available()) GTEST_SKIP() << "no GPU present";   \
  } while (0)

}  // namespace spillway::kernels::testing
