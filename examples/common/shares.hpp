// How a step's batch is shared out (Note [Micro-batches] in parameters_shared.cpp): one whole
// batch, micro-batches in one process, or one micro-batch per rank of a data-parallel job.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"
#include "examples/common/options.hpp"

namespace spillway::examples {

struct batch_shares {
  int count = 1;  ///< micro-batches each step's batch is split into, over every process
  int first = 0;  ///< this process's first micro-batch
  int local = 1;  ///< micro-batches this process runs
  int zero = 2;   ///< ZeRO stage of a data-parallel job (1 or 2)
  std::uint64_t bucket_bytes = std::uint64_t{1} << 20;  ///< a data-parallel job's gradient buckets (--bucket-kib)
  std::shared_ptr<comm::communicator> comm;  ///< the ranks of a data-parallel job, else null

  /// --micro-batches N: N in this process; --data-parallel: one per rank of the job (the
  /// communicator of every process, comm::communicator::world()).
  static batch_shares from(const example_options& o);
  [[nodiscard]] int ranks() const noexcept { return comm ? comm->size() : 1; }
  [[nodiscard]] int rank() const noexcept { return comm ? comm->rank() : 0; }
  /// The batch of one micro-batch: `batch` / count; config_error when count does not divide it.
  [[nodiscard]] int micro_batch(int batch) const;
};

/// After an error in a data-parallel job: ends the whole job with `code` (the communicator's
/// abort, MPI_Abort) so that no rank waits for this one, nor this one for MPI's finalisation; a
/// no-op outside one (a program of one process returns its code as usual).
void end_data_parallel_job(int code);

}  // namespace spillway::examples
