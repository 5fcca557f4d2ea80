// comm/: a set of point-to-point MPI requests, each with the rank it talks to, and the one wait
// of every MPI collective: polled with MPI_Testsome up to a deadline (Note [Waiting with a timeout]).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace spillway::comm::detail {

/// Note [Waiting with a timeout]
/// A collective never blocks inside MPI: it posts one MPI_Isend/MPI_Irecv per peer and chunk,
/// then polls MPI_Testsome until all are done or comm_options::timeout passes. On timeout the
/// message names the ranks whose messages have not arrived (it failed, was killed, or is stuck),
/// the receives still pending are cancelled and every pending request is freed. A send already
/// matched may still read its buffer afterwards, which is one reason the communicator is failed
/// for good after a comm_error and the job should end (communicator::abort).

/// "120 s", "1500 ms": a timeout as messages give it.
std::string duration_text(std::chrono::milliseconds t);

/// Throws comm_error "WHAT: CALL: <MPI's text>" when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* what, const std::string& call);

class mpi_requests {
 public:
  mpi_requests(MPI_Comm comm, const char* what) : comm_(comm), what_(what) {}
  mpi_requests(const mpi_requests&) = delete;
  mpi_requests& operator=(const mpi_requests&) = delete;
  /// Cancels and frees what is still pending (after an exception between post and wait).
  ~mpi_requests();

  /// Posts a receive of exactly `bytes` bytes from `peer` (bytes <= INT_MAX).
  void receive(void* data, std::size_t bytes, int peer, int tag);
  /// Posts a send of `bytes` bytes to `peer` (bytes <= INT_MAX).
  void send(const void* data, std::size_t bytes, int peer, int tag);
  /// Waits for every posted request (timeout 0: for ever); then the set is empty again.
  /// Throws comm_error naming the ranks still missing at the deadline, or the rank whose
  /// message failed or had the wrong length (ranks that passed different sizes).
  void wait_all(std::chrono::milliseconds timeout, int my_rank, int ranks);
  [[nodiscard]] bool empty() const noexcept { return requests_.empty(); }

 private:
  void abandon() noexcept;  // cancel pending receives, free every pending request, clear

  MPI_Comm comm_;
  const char* what_;
  std::vector<MPI_Request> requests_;
  std::vector<int> peers_;
  std::vector<long long> expected_;  // bytes a receive must get; -1 for a send
};

}  // namespace spillway::comm::detail
