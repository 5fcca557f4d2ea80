// comm/: the ranks of a data-parallel run. A communicator is a group of processes (MPI) with the
// few collectives data parallel needs, on host memory, reduced in Spillway's own fixed order so
// that results never depend on the order MPI happens to choose (Note [Fixed-order reductions]).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace spillway::comm {

/// [begin, end) of rank r's shard of n elements over `ranks` ranks: consecutive, the first
/// n % ranks ranks one element more. usage_error for ranks < 1 or r outside [0, ranks).
std::pair<std::size_t, std::size_t> shard_range(std::size_t n, int ranks, int r);

struct comm_options {
  /// How long a collective may wait for the other ranks before it fails with a comm_error naming
  /// the ranks it still waits for (a rank that failed or hangs); 0 waits for ever.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

/// Note [Fixed-order reductions]
/// Every sum over ranks is taken in fp32 as ((x_0 + x_1) + x_2) + ... + x_{N-1}, rank 0 first,
/// element by element, on the rank that owns the element's shard, and the sums are then shared
/// as bytes. So a reduction gives the same bits on every rank, in every run, for every MPI
/// algorithm and process placement, and equals one process adding N buffers in rank order.

class communicator {
 public:
  /// All the processes of this job (MPI_COMM_WORLD under mpirun). Starts MPI on first use
  /// (MPI_Init_thread, serialized) and finalizes it at exit. A process not started by mpirun is a
  /// world of one. Collective: each call is a context of its own (a duplicate of MPI_COMM_WORLD,
  /// so one communicator's messages never meet another's), made by every rank, in the same order
  /// as its other world() calls; comm_error when not every rank calls it within the timeout.
  /// After a comm_error a communicator is failed for good (comm/comm_error.hpp).
  static std::shared_ptr<communicator> world(comm_options options = {});
  /// One process alone, without MPI: every collective is a copy.
  static std::shared_ptr<communicator> solo();

  virtual ~communicator() = default;
  [[nodiscard]] virtual int rank() const noexcept = 0;
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// "mpi" or "solo".
  [[nodiscard]] virtual std::string engine() const = 0;

  /// Every rank passes a collective the same sizes (and root); ranks that do not fail it, each
  /// with a comm_error naming a rank that differs.
  ///
  /// data[i] = sum over ranks of data[i] (Note [Fixed-order reductions]), n elements on every rank.
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  /// out = this rank's shard (shard_range(n, size(), rank())) of the sum over ranks of `in`
  /// (n elements on every rank; `out` holds the shard's length).
  virtual void reduce_scatter_sum(const float* in, float* out, std::size_t n) = 0;
  /// out (n elements of `elem_bytes` each) = every rank's shard, in rank order; `shard` holds
  /// this rank's shard_range(n, size(), rank()). `shard` may point into `out` at its own place.
  virtual void all_gather(const void* shard, void* out, std::size_t n, std::size_t elem_bytes) = 0;
  /// data (bytes) = root's data on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Returns when every rank has reached it.
  virtual void barrier() = 0;
  /// Ends the whole job at once (MPI_Abort) with `code`, for a rank whose error the others would
  /// otherwise wait for; a world of one just exits.
  [[noreturn]] virtual void abort(int code) = 0;
};

}  // namespace spillway::comm
