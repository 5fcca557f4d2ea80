// Huge pages for I/O buffers: MADV_HUGEPAGE for pages still to come, MADV_COLLAPSE for the
// ones already there, 2 MiB at a time so one immovable page costs only its own huge page.
#include "device/huge_pages.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>

namespace spillway::detail {

// Note [Huge pages for registered buffers]
// A block of 1 MiB in 4 KiB pages is up to 256 scatter-gather segments. Block devices cap the
// segments of one request (max_segments), so such a block is split (on a virtio disk with
// 254 segments: 1016 KiB + 8 KiB); and a virtio queue without indirect descriptors spends one
// ring entry per segment, so one such request fills a 256-entry ring and the drive sees a
// queue depth of one whatever depth io_uring keeps. Physically contiguous buffers make a
// block one or a few segments: the requests are not split, many fit in the ring at once, and
// on real NVMe the PRP lists and IOMMU mappings shrink as well. Measured on a virtio disk
// (1 MiB blocks, depth 32, O_DIRECT): reads 1.2-1.4 GB/s from 4 KiB pages, 3.2-3.3 GB/s from
// huge pages.
// The pinned pool's regions are the buffers the NVMe tier registers, so the ring backs each
// new region with huge pages just before registering it (registration pins the pages, after
// which they can no longer be collapsed; pages registration itself faults in come as huge
// pages). MADV_COLLAPSE copies a populated region's pages once: 0.25-2.3 ms per MiB measured
// here, most of it the kernel finding free huge pages. A region is registered once in a
// training run, so this is paid when the tier is made or the pool grows, not per move; a pool
// that maps its regions MADV_HUGEPAGE before first touch leaves nothing to collapse. Memory
// pinned by the CUDA driver cannot be collapsed; the calls then fail fast and change nothing.
// Kernels without MADV_COLLAPSE (before 6.1) get MADV_HUGEPAGE alone, which helps the pages
// faulted in later.

namespace {
constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
#ifndef MADV_COLLAPSE
constexpr int madv_collapse = 25;  // linux/mman.h, since 6.1
#else
constexpr int madv_collapse = MADV_COLLAPSE;
#endif
}  // namespace

huge_page_result back_with_huge_pages(void* p, std::size_t bytes) noexcept {
  huge_page_result r;
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(huge - 1);
  if (p == nullptr || end <= begin) return r;
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) return r;
  r.advised = end - begin;
  for (std::uintptr_t a = begin; a < end; a += huge) {
    if (::madvise(reinterpret_cast<void*>(a), huge, madv_collapse) == 0)
      r.collapsed += huge;
    else if (errno == ENOMEM)
      break;  // no huge page free: the rest would fail the same way, slowly
    // EINVAL (nothing mapped there yet, or no MADV_COLLAPSE) and EAGAIN (pinned or busy
    // pages): this 2 MiB stays as it is; pages faulted in later still come as huge pages.
  }
  return r;
}

}  // namespace spillway::detail
