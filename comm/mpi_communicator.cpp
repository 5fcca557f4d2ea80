// comm/: world(): the processes of the job over MPI (OpenMPI), each collective as point-to-point
// messages per peer so the sums are taken in Spillway's order (Note [Fixed-order reductions]) and
// a rank that does not answer is named (Note [Waiting with a timeout]).
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "comm/checks.hpp"
#include "comm/comm_error.hpp"
#include "comm/communicator.hpp"
#include "comm/fixed_order_sum.hpp"
#include "comm/message_size.hpp"
#include "comm/mpi_requests.hpp"

namespace spillway::comm {

namespace {

using detail::check_mpi;
using detail::mpi_requests;

// One tag per kind of message; MPI keeps the messages of one pair and tag in order, and every
// communicator has a context of its own, so these never meet another collective's messages.
constexpr int tag_reduce_scatter = 101;
constexpr int tag_all_gather = 102;
constexpr int tag_broadcast = 103;
constexpr int tag_barrier = 104;
constexpr int tag_agree = 105;

/// Starts MPI once per process (if the program has not) and finalizes it at exit.
void ensure_mpi() {
  static std::mutex m;
  static bool done = false;
  std::lock_guard lock(m);
  if (done) return;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw comm_error("world: MPI was already finalized in this process");
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) throw comm_error("world: MPI_Init_thread failed (error " + std::to_string(rc) + ")");
    // Collectives may come from a collective_stream's thread as well as the caller's, one at a time.
    if (provided < MPI_THREAD_SERIALIZED)
      throw comm_error("world: this MPI gives thread support level " + std::to_string(provided) +
                       ", below MPI_THREAD_SERIALIZED, which Spillway needs (collectives run on a thread of their own); "
                       "use an MPI built with thread support");
    // Ours, so ours to finalize: after main returns, before the C runtime goes.
    std::atexit([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    });
  } else {
    // The program started MPI itself: its level must allow the collective stream's thread too
    // (a plain MPI_Init gives MPI_THREAD_SINGLE).
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      throw comm_error("world: the program initialised MPI with thread support level " + std::to_string(provided) +
                       ", below MPI_THREAD_SERIALIZED, which Spillway needs (collectives run on a thread of their own); "
                       "initialise it with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) or leave it to Spillway");
  }
  // Errors come back as codes, which every call turns into a comm_error.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  done = true;
}

class mpi_communicator final : public communicator {
 public:
  mpi_communicator(MPI_Comm comm, comm_options options) : comm_(comm), options_(options) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~mpi_communicator() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string engine() const override { return "mpi"; }

  void all_reduce_sum(float* data, std::size_t n) override {
    detail::check_all_reduce(data, n);
    const std::size_t b = shard_range(n, size_, rank_).first;
    // The owner's sum lands at its own place in `data`; fixed_order_sum reads each block before
    // writing it, and the shards sent to peers are the other places, which nothing writes.
    guarded("all_reduce_sum", [&] {
      agree("all_reduce_sum", "n", n, nullptr, 0);
      reduce_scatter("all_reduce_sum", data, data + b, n);
      gather("all_reduce_sum", data + b, data, n, sizeof(float));
    });
  }

  void reduce_scatter_sum(const float* in, float* out, std::size_t n) override {
    detail::check_reduce_scatter(in, out, n, size_, rank_);
    guarded("reduce_scatter_sum", [&] {
      agree("reduce_scatter_sum", "n", n, nullptr, 0);
      reduce_scatter("reduce_scatter_sum", in, out, n);
    });
  }

  void all_gather(const void* shard, void* out, std::size_t n, std::size_t elem_bytes) override {
    detail::check_all_gather(shard, out, n, elem_bytes, size_, rank_);
    guarded("all_gather", [&] {
      agree("all_gather", "n", n, "elem_bytes", elem_bytes);
      gather("all_gather", shard, out, n, elem_bytes);
    });
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    detail::check_broadcast(data, bytes, root, size_);
    guarded("broadcast", [&] {
      agree("broadcast", "bytes", bytes, "root", static_cast<std::uint64_t>(root));
      const std::size_t chunk = detail::max_message_bytes();
      for (std::size_t c = 0; c < bytes; c += chunk) {
        const std::size_t len = std::min(chunk, bytes - c);
        mpi_requests reqs(comm_, "broadcast");
        auto* p = static_cast<char*>(data) + c;
        if (rank_ == root) {
          for (int peer = 0; peer < size_; ++peer)
            if (peer != root) reqs.send(p, len, peer, tag_broadcast);
        } else {
          reqs.receive(p, len, root, tag_broadcast);
        }
        reqs.wait_all(options_.timeout, rank_, size_);
      }
    });
  }

  void barrier() override {
    // Every rank tells every other: each then knows exactly who has not arrived.
    guarded("barrier", [&] {
      mpi_requests reqs(comm_, "barrier");
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        reqs.receive(nullptr, 0, peer, tag_barrier);
        reqs.send(nullptr, 0, peer, tag_barrier);
      }
      reqs.wait_all(options_.timeout, rank_, size_);
    });
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);  // MPI_Abort does not return; if it did, end this process anyway
  }

 private:
  /// Runs a collective; a comm_error fails the communicator for good (comm/comm_error.hpp).
  template <class F>
  void guarded(const char* what, F&& body) {
    if (!failed_.empty())
      throw comm_error(std::string(what) + ": this communicator failed earlier (" + failed_ +
                       "); end the job");
    try {
      body();
    } catch (const comm_error& e) {
      failed_ = e.what();
      throw;
    }
  }

  /// Every rank checks that the others passed this collective the same sizes (and root): ranks
  /// that disagree would otherwise sum or copy misaligned bytes, some of them without an error.
  /// A mismatch fails the collective on every rank, naming a rank that differs and both values.
  void agree(const char* what, const char* a_name, std::uint64_t a, const char* b_name, std::uint64_t b) {
    if (size_ == 1) return;
    const std::array<std::uint64_t, 2> mine{a, b};
    std::vector<std::array<std::uint64_t, 2>> theirs(static_cast<std::size_t>(size_));
    {
      mpi_requests reqs(comm_, what);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        reqs.receive(theirs[static_cast<std::size_t>(peer)].data(), sizeof mine, peer, tag_agree);
        reqs.send(mine.data(), sizeof mine, peer, tag_agree);
      }
      reqs.wait_all(options_.timeout, rank_, size_);
    }
    auto args = [&](const std::array<std::uint64_t, 2>& v) {
      std::string s = std::string(a_name) + " = " + std::to_string(v[0]);
      if (b_name != nullptr) s += ", " + std::string(b_name) + " = " + std::to_string(v[1]);
      return s;
    };
    for (int peer = 0; peer < size_; ++peer) {
      const auto& v = theirs[static_cast<std::size_t>(peer)];
      if (peer == rank_ || v == mine) continue;
      throw comm_error(std::string(what) + ": the ranks disagree: rank " + std::to_string(peer) + " passed " + args(v) +
                       ", this rank (" + std::to_string(rank_) + ") " + args(mine) +
                       "; every rank must pass the same sizes" + (b_name != nullptr && std::string(b_name) == "root" ? " and root" : ""));
    }
  }

  /// Note [Fixed-order reductions]: every rank sends each peer that peer's shard of `in`; the
  /// owner sums the N contributions in rank order. Chunked by max_message_bytes, so staging holds
  /// (N-1) chunks and no message passes INT_MAX bytes.
  void reduce_scatter(const char* what, const float* in, float* out, std::size_t n) {
    const auto [b, e] = shard_range(n, size_, rank_);
    const std::size_t mine = e - b;
    if (size_ == 1) {
      if (out != in && n > 0) std::memmove(out, in, n * sizeof(float));
      return;
    }
    const std::size_t chunk = std::max<std::size_t>(1, detail::max_message_bytes() / sizeof(float));
    const std::size_t largest_shard = (n + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_);
    const std::size_t slot = std::min(chunk, mine);
    staging_.resize(slot * static_cast<std::size_t>(size_));  // slot r: rank r's part (ours unused)
    std::vector<const float*> sources(static_cast<std::size_t>(size_));
    for (std::size_t c = 0; c < largest_shard; c += chunk) {
      mpi_requests reqs(comm_, what);
      const std::size_t len = c < mine ? std::min(chunk, mine - c) : 0;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_ || len == 0) continue;
        reqs.receive(staging_.data() + static_cast<std::size_t>(peer) * slot, len * sizeof(float),
                     peer, tag_reduce_scatter);
      }
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        const auto [pb, pe] = shard_range(n, size_, peer);
        if (c >= pe - pb) continue;
        reqs.send(in + pb + c, std::min(chunk, pe - pb - c) * sizeof(float), peer, tag_reduce_scatter);
      }
      reqs.wait_all(options_.timeout, rank_, size_);
      if (len == 0) continue;
      for (int r = 0; r < size_; ++r)
        sources[static_cast<std::size_t>(r)] =
            r == rank_ ? in + b + c : staging_.data() + static_cast<std::size_t>(r) * slot;
      detail::fixed_order_sum(sources.data(), size_, out + c, len);
    }
  }

  /// Every rank's shard to every rank, as bytes, each into its place in `out`.
  void gather(const char* what, const void* shard, void* out, std::size_t n, std::size_t elem_bytes) {
    const auto [b, e] = shard_range(n, size_, rank_);
    auto* dst = static_cast<char*>(out);
    const auto* src = static_cast<const char*>(shard);
    const std::size_t mine = (e - b) * elem_bytes;
    const std::size_t chunk = detail::max_message_bytes();
    const std::size_t largest =
        (n + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_) * elem_bytes;
    for (std::size_t c = 0; c < largest && size_ > 1; c += chunk) {
      mpi_requests reqs(comm_, what);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        const auto [pb, pe] = shard_range(n, size_, peer);
        const std::size_t theirs = (pe - pb) * elem_bytes;
        if (c < theirs) reqs.receive(dst + pb * elem_bytes + c, std::min(chunk, theirs - c), peer, tag_all_gather);
      }
      if (c < mine) {
        for (int peer = 0; peer < size_; ++peer)
          if (peer != rank_) reqs.send(src + c, std::min(chunk, mine - c), peer, tag_all_gather);
      }
      reqs.wait_all(options_.timeout, rank_, size_);
    }
    if (dst + b * elem_bytes != src && mine > 0) std::memmove(dst + b * elem_bytes, src, mine);
  }

  MPI_Comm comm_;
  comm_options options_;
  int rank_ = 0;
  int size_ = 1;
  std::string failed_;         // the first comm_error's text; non-empty: failed for good
  std::vector<float> staging_;  // reduce_scatter: the peers' parts of one chunk of our shard
};

}  // namespace

std::shared_ptr<communicator> communicator::world(comm_options options) {
  ensure_mpi();
  // A context of its own (a duplicate of MPI_COMM_WORLD): messages left behind by a failed
  // communicator, or the program's own MPI traffic, never meet this one's. MPI_Comm_idup is
  // collective, so every rank calls world() the same number of times, in the same order.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req), "world", "MPI_Comm_idup");
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int flag = 0, idle = 0;
  while (true) {
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "world", "MPI_Test");
    if (flag) break;
    if (options.timeout.count() > 0 && clock::now() - start >= options.timeout) {
      int size = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      // The request of a collective may be neither cancelled nor freed: it is left behind.
      throw comm_error("world: not all " + std::to_string(size) + " ranks called world() within " +
                       std::to_string(options.timeout.count()) +
                       " ms (a rank failed, was killed, or is stuck before it)");
    }
    if (++idle > 64) std::this_thread::sleep_for(std::chrono::microseconds(std::min(idle - 64, 200)));
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_shared<mpi_communicator>(comm, options);
}

}  // namespace spillway::comm
