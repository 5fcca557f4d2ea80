// The one partition of host-side optimizer loops over flat buffers: fixed chunks dealt out
// statically by oneTBB. The CPU Adam and numa_array's first touch both use it (Note [First touch]).
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstddef>

namespace spillway::kernels::detail {

/// Elements per chunk: 16 Ki (64 KiB of floats), a multiple of every vector width, so every
/// chunk of a 64-byte aligned buffer starts 64-byte aligned.
inline constexpr std::size_t host_chunk = std::size_t{1} << 14;

// Note [First touch]
// Linux places a page on the NUMA node of the thread that first writes it (numa_alloc_local's
// policy, and the default one). numa_array writes its zeros with for_each_host_chunk, and
// cpu_adam_step updates with it too: the same chunks, dealt out by oneTBB's static_partitioner,
// which splits the range evenly over the arena's threads and hints each piece to the same
// thread on every call with the same n. So, as far as the threads keep their cores, each page
// is updated by a thread on the node that holds it.

/// Runs body(begin, end) over [0, n): whole chunks of host_chunk elements (the last one short),
/// one contiguous run of chunks per thread, with a static partition. Every index is handled by
/// exactly one call.
template <class F>
void for_each_host_chunk(std::size_t n, const F& body) {
  if (n == 0) return;
  const std::size_t chunks = (n + host_chunk - 1) / host_chunk;
  if (chunks == 1) {
    body(std::size_t{0}, n);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, chunks, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        body(r.begin() * host_chunk, std::min(n, r.end() * host_chunk));
      },
      tbb::static_partitioner());
}

}  // namespace spillway::kernels::detail
