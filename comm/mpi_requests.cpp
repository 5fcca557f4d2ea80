// comm/: posting point-to-point requests and waiting for them with a deadline, naming the ranks
// that did not answer (Note [Waiting with a timeout]).
#include "comm/mpi_requests.hpp"

#include <algorithm>
#include <climits>
#include <thread>

#include "comm/comm_error.hpp"

namespace spillway::comm::detail {

std::string duration_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

namespace {

std::string mpi_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

/// "rank 1", "ranks 1 and 3", "ranks 1, 2 and 3"
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
  std::string s = "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

void check_mpi(int rc, const char* what, const std::string& call) {
  if (rc != MPI_SUCCESS) throw comm_error(std::string(what) + ": " + call + ": " + mpi_text(rc));
}

mpi_requests::~mpi_requests() { abandon(); }

void mpi_requests::receive(void* data, std::size_t bytes, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r), what_,
            "MPI_Irecv from rank " + std::to_string(peer));
  requests_.push_back(r);
  peers_.push_back(peer);
  expected_.push_back(static_cast<long long>(bytes));
}

void mpi_requests::send(const void* data, std::size_t bytes, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r), what_,
            "MPI_Isend to rank " + std::to_string(peer));
  requests_.push_back(r);
  peers_.push_back(peer);
  expected_.push_back(-1);
}

void mpi_requests::wait_all(std::chrono::milliseconds timeout, int my_rank, int ranks) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const int count = static_cast<int>(requests_.size());
  std::vector<int> done(requests_.size());
  std::vector<MPI_Status> statuses(requests_.size());
  int remaining = count;
  int idle = 0;
  while (remaining > 0) {
    int outcount = 0;
    const int rc = MPI_Testsome(count, requests_.data(), &outcount, done.data(), statuses.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      abandon();
      check_mpi(rc, what_, "MPI_Testsome");
    }
    if (outcount == MPI_UNDEFINED) break;
    for (int k = 0; k < outcount; ++k) {
      const int i = done[k];
      const MPI_Status& st = statuses[k];
      if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS) {
        const std::string call = (expected_[i] < 0 ? "the message to rank " : "the message from rank ") +
                                 std::to_string(peers_[i]);
        const int err = st.MPI_ERROR;
        abandon();
        throw comm_error(std::string(what_) + ": " + call + " failed: " + mpi_text(err) +
                         (err == MPI_ERR_TRUNCATE ? " (do all ranks pass the same sizes?)" : ""));
      }
      if (expected_[i] >= 0) {
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if (got != expected_[i]) {
          const int peer = peers_[i];
          const long long want = expected_[i];
          abandon();
          throw comm_error(std::string(what_) + ": rank " + std::to_string(peer) + " sent " +
                           std::to_string(got) + " bytes where " + std::to_string(want) +
                           " were expected (do all ranks pass the same sizes?)");
        }
      }
    }
    remaining -= outcount;
    if (outcount > 0) {
      idle = 0;
      continue;
    }
    if (timeout.count() > 0 && clock::now() - start >= timeout) {
      std::vector<int> missing;
      for (std::size_t i = 0; i < requests_.size(); ++i)
        if (requests_[i] != MPI_REQUEST_NULL) missing.push_back(peers_[i]);
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      abandon();
      std::string msg = std::string(what_) + ": " + ranks_text(missing) +
                        (missing.size() == 1 ? " did" : " did") + " not answer within " +
                        duration_text(timeout) + " (" + (missing.size() == 1 ? "it" : "each") +
                        " failed, was killed, or is stuck)";
      if (static_cast<int>(missing.size()) < ranks - 1) msg += "; the other ranks are fine";
      msg += "; a rank that is only slow (a long checkpoint save) needs a longer comm_options::timeout";
      msg += " [this is rank " + std::to_string(my_rank) + " of " + std::to_string(ranks) + "]";
      throw comm_error(msg);
    }
    // Spin briefly (a partner a few microseconds behind), then back off to at most 200 us so a
    // long wait does not take a core from the ranks sharing it.
    if (++idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(idle - 64, 200)));
    } else {
      std::this_thread::yield();
    }
  }
  requests_.clear();
  peers_.clear();
  expected_.clear();
}

void mpi_requests::abandon() noexcept {
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    // A receive can be cancelled; a send cannot be (MPI-4 deprecates it), so it is only freed.
    if (expected_[i] >= 0) MPI_Cancel(&requests_[i]);
    MPI_Request_free(&requests_[i]);
  }
  requests_.clear();
  peers_.clear();
  expected_.clear();
}

}  // namespace spillway::comm::detail
