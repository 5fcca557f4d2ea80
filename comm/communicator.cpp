// comm/: shard_range, the argument checks shared by every engine, and solo(): one process, no MPI,
// where every collective is a copy.
#include "comm/communicator.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "comm/checks.hpp"
#include "comm/message_size.hpp"
#include "device/error.hpp"

namespace spillway::comm {

std::pair<std::size_t, std::size_t> shard_range(std::size_t n, int ranks, int r) {
  SPILLWAY_EXPECTS_T(usage_error, ranks >= 1,
                     "shard_range: " + std::to_string(ranks) + " ranks (at least 1)");
  SPILLWAY_EXPECTS_T(usage_error, r >= 0 && r < ranks,
                     "shard_range: rank " + std::to_string(r) + " is not in [0, " +
                         std::to_string(ranks) + ")");
  const auto k = static_cast<std::size_t>(ranks);
  const auto i = static_cast<std::size_t>(r);
  const std::size_t base = n / k, extra = n % k;
  const std::size_t begin = i * base + (i < extra ? i : extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

namespace detail {

namespace {
std::atomic<std::size_t> g_max_message_bytes{std::size_t{16} << 20};

std::size_t shard_length(std::size_t n, int ranks, int rank) {
  const auto [b, e] = shard_range(n, ranks, rank);
  return e - b;
}
}  // namespace

std::size_t max_message_bytes() noexcept { return g_max_message_bytes.load(); }

std::size_t set_max_message_bytes(std::size_t bytes) {
  SPILLWAY_EXPECTS_T(usage_error,
                     bytes >= sizeof(float) &&
                         bytes <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                     "set_max_message_bytes: " + std::to_string(bytes) +
                         " bytes is not in [4, INT_MAX]");
  return g_max_message_bytes.exchange(bytes);
}

void check_all_reduce(const float* data, std::size_t n) {
  SPILLWAY_EXPECTS_T(usage_error, data != nullptr || n == 0,
                     "all_reduce_sum: data is null for " + std::to_string(n) + " elements");
}

void check_reduce_scatter(const float* in, const float* out, std::size_t n, int ranks, int rank) {
  SPILLWAY_EXPECTS_T(usage_error, in != nullptr || n == 0,
                     "reduce_scatter_sum: in is null for " + std::to_string(n) + " elements");
  const std::size_t len = shard_length(n, ranks, rank);
  SPILLWAY_EXPECTS_T(usage_error, out != nullptr || len == 0,
                     "reduce_scatter_sum: out is null for a shard of " + std::to_string(len) +
                         " elements");
}

void check_all_gather(const void* shard, const void* out, std::size_t n, std::size_t elem_bytes,
                      int ranks, int rank) {
  SPILLWAY_EXPECTS_T(usage_error, elem_bytes > 0, "all_gather: elem_bytes is 0");
  SPILLWAY_EXPECTS_T(usage_error, n <= std::numeric_limits<std::size_t>::max() / elem_bytes,
                     "all_gather: " + std::to_string(n) + " elements of " +
                         std::to_string(elem_bytes) + " bytes overflow size_t");
  SPILLWAY_EXPECTS_T(usage_error, out != nullptr || n == 0,
                     "all_gather: out is null for " + std::to_string(n) + " elements");
  const std::size_t len = shard_length(n, ranks, rank);
  SPILLWAY_EXPECTS_T(usage_error, shard != nullptr || len == 0,
                     "all_gather: shard is null for a shard of " + std::to_string(len) +
                         " elements");
}

void check_broadcast(const void* data, std::size_t bytes, int root, int ranks) {
  SPILLWAY_EXPECTS_T(usage_error, root >= 0 && root < ranks,
                     "broadcast: root " + std::to_string(root) + " is not a rank of " +
                         std::to_string(ranks));
  SPILLWAY_EXPECTS_T(usage_error, data != nullptr || bytes == 0,
                     "broadcast: data is null for " + std::to_string(bytes) + " bytes");
}

}  // namespace detail

namespace {

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  if (to != from && bytes > 0) std::memmove(to, from, bytes);
}

/// One process, no MPI. A reduction over one rank is its input (x_0), so results equal world().
class solo_communicator final : public communicator {
 public:
  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int size() const noexcept override { return 1; }
  [[nodiscard]] std::string engine() const override { return "solo"; }

  void all_reduce_sum(float* data, std::size_t n) override { detail::check_all_reduce(data, n); }
  void reduce_scatter_sum(const float* in, float* out, std::size_t n) override {
    detail::check_reduce_scatter(in, out, n, 1, 0);
    copy_bytes(out, in, n * sizeof(float));
  }
  void all_gather(const void* shard, void* out, std::size_t n, std::size_t elem_bytes) override {
    detail::check_all_gather(shard, out, n, elem_bytes, 1, 0);
    copy_bytes(out, shard, n * elem_bytes);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    detail::check_broadcast(data, bytes, root, 1);
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

std::shared_ptr<communicator> communicator::solo() {
  return std::make_shared<solo_communicator>();
}

}  // namespace spillway::comm
