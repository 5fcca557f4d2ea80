// comm/: the error of a collective that could not finish: a rank failed, was killed, hangs, or
// MPI/NCCL reported a failure. The message names the collective and the ranks concerned.
#pragma once

#include "device/error.hpp"

namespace spillway {

/// A collective failed: another rank did not answer within comm_options::timeout, or MPI or NCCL
/// reported an error (its own text is quoted). The message names the collective and the ranks.
/// It carries no source location: the cause is another process, not a line of Spillway.
/// After one, the communicator is failed for good (every later call throws it again): end the
/// job (communicator::abort), since the ranks no longer agree on which collective comes next.
class comm_error : public error {
 public:
  using error::error;
};

namespace comm {
using spillway::comm_error;
}  // namespace comm

}  // namespace spillway
