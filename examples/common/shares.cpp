// batch_shares: micro-batches and ranks.
#include "examples/common/shares.hpp"

#include <chrono>
#include <cstdint>
#include <string>

#include "device/error.hpp"

namespace spillway::examples {

namespace {
// Held, not watched: an error reaches the program's handler after train() has unwound and let
// the model's communicator go, and end_data_parallel_job still has to end the job then.
std::shared_ptr<comm::communicator>& job_world() {
  static std::shared_ptr<comm::communicator> w;
  return w;
}
}  // namespace

void end_data_parallel_job(int code) {
  if (const auto& c = job_world(); c && c->size() > 1) c->abort(code);
}

batch_shares batch_shares::from(const example_options& o) {
  batch_shares s;
  s.zero = o.zero;
  s.bucket_bytes = o.bucket_bytes;
  if (o.data_parallel) {
    comm::comm_options co;
    co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout_s * 1e3));
    s.comm = comm::communicator::world(co);
    job_world() = s.comm;
    s.count = s.comm->size();
    s.first = s.comm->rank();
    s.local = 1;
    return s;
  }
  s.count = o.micro_batches;
  s.local = o.micro_batches;
  return s;
}

int batch_shares::micro_batch(int batch) const {
  if (count < 1 || batch % count != 0)
    throw config_error("the batch of " + std::to_string(batch) + " does not split into " + std::to_string(count) +
                       (comm ? " ranks" : " micro-batches") + "; give a count that divides it");
  return batch / count;
}

}  // namespace spillway::examples
