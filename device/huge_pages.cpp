// Huge pages for I/O buffers: MADV_HUGEPAGE for pages still to come, MADV_COLLAPSE for the
// ones already there, 2 MiB at a time so one immovable page costs only its own huge page; and
// a measure of how much of a buffer huge pages really back.
#include "device/huge_pages.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>

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
// The pinned pool's regions are the buffers the NVMe tier registers. Pinned pages cannot be
// collapsed into huge pages afterwards (MADV_COLLAPSE fails with EAGAIN on them, and the CUDA
// driver pins at cudaHostRegister), so the advice must come before anything pins the memory:
// each backend's Device::allocate_pinned calls back_with_huge_pages right after mmap, and the
// pages faulted in later (by the first write, by cudaHostRegister, by io_uring registration)
// come as huge pages. The memory is fresh then, so MADV_COLLAPSE finds nothing to collapse;
// it is there for callers with populated memory, where it copies the pages once
// (0.25-2.3 ms per MiB measured here, most of it the kernel finding free huge pages).
// Advice is a request, not a result: in madvise mode with no free huge page (memory
// fragmented, compaction off) the pages come as 4 KiB ones, and with THP set to [never] they
// always do. What the buffers got is measured with huge_page_backed_bytes
// (Note [Measuring huge-page backing]). Kernels without MADV_COLLAPSE (before 6.1) get
// MADV_HUGEPAGE alone, which is all fresh memory needs.

// Note [Measuring huge-page backing]
// huge_page_backed_bytes asks the kernel which pages of the range are mapped huge:
// - Linux 6.7 and later: the PAGEMAP_SCAN ioctl on /proc/self/pagemap, with PAGE_IS_HUGE and
//   PAGE_IS_PRESENT required. It walks the page tables of exactly the range, needs no
//   privilege (unlike the PFNs in pagemap and /proc/kpageflags, which need CAP_SYS_ADMIN), and
//   returns address ranges, clamped here to [p, p + bytes). PAGE_IS_HUGE is set for
//   PMD-mapped THP and for hugetlb pages; a THP split into 4 KiB mappings, and multi-size
//   THP (16-64 KiB folios mapped by PTEs), count as not huge.
// - Otherwise: /proc/self/smaps, whose AnonHugePages is per mapping (VMA), not per address.
//   Each VMA overlapping the range contributes min(AnonHugePages, its overlap with the range).
//   This is an upper estimate: a VMA that reaches past the range (the kernel merges adjacent
//   anonymous mappings with the same flags) may hold its huge pages outside it. For a region
//   that is its own mmap, as allocate_pinned makes them, it is exact. Reading smaps walks every
//   mapping of the process (milliseconds in a process with thousands, as CUDA makes).
// Both are snapshots: khugepaged may collapse unpinned pages later, and an munmap, mprotect or
// madvise of part of a huge page splits its mapping. Pages not yet faulted in count as not
// backed, so measure after the memory is populated (io_uring registration populates it).

namespace {
constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
#ifndef MADV_COLLAPSE
constexpr int madv_collapse = 25;  // linux/mman.h, since 6.1
#else
constexpr int madv_collapse = MADV_COLLAPSE;
#endif

// PAGEMAP_SCAN (linux/fs.h, since 6.7), declared here for older headers; the layout is ABI.
struct pm_page_region {
  std::uint64_t start;
  std::uint64_t end;
  std::uint64_t categories;
};
struct pm_scan_arg {
  std::uint64_t size;
  std::uint64_t flags;
  std::uint64_t start;
  std::uint64_t end;
  std::uint64_t walk_end;
  std::uint64_t vec;
  std::uint64_t vec_len;
  std::uint64_t max_pages;
  std::uint64_t category_inverted;
  std::uint64_t category_mask;
  std::uint64_t category_anyof_mask;
  std::uint64_t return_mask;
};
static_assert(sizeof(pm_page_region) == 24 && sizeof(pm_scan_arg) == 96);
constexpr unsigned long pagemap_scan = _IOWR('f', 16, pm_scan_arg);
constexpr std::uint64_t page_is_present = 1u << 3;
constexpr std::uint64_t page_is_huge = 1u << 6;

std::size_t overlap(std::uint64_t a, std::uint64_t b, std::uint64_t begin, std::uint64_t end) noexcept {
  const auto lo = std::max(a, begin);
  const auto hi = std::min(b, end);
  return hi > lo ? static_cast<std::size_t>(hi - lo) : 0;
}

// Bytes of [begin, end) in huge pages by PAGEMAP_SCAN; false when the kernel cannot tell.
bool scan_huge(std::uintptr_t begin, std::uintptr_t end, std::size_t& out) noexcept {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::uintptr_t at = begin & ~(page - 1);
  const std::uintptr_t stop = (end + page - 1) & ~(page - 1);
  pm_page_region vec[64];
  std::size_t sum = 0;
  bool ok = true;
  while (at < stop) {
    pm_scan_arg arg{};
    arg.size = sizeof arg;
    arg.start = at;
    arg.end = stop;
    arg.vec = reinterpret_cast<std::uintptr_t>(vec);
    arg.vec_len = std::size(vec);
    arg.category_mask = page_is_present | page_is_huge;
    arg.return_mask = page_is_present | page_is_huge;
    const int n = ::ioctl(fd, pagemap_scan, &arg);
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;  // ENOTTY or EINVAL before 6.7
      break;
    }
    for (int i = 0; i < n; ++i) sum += overlap(vec[i].start, vec[i].end, begin, end);
    if (arg.walk_end <= at) break;  // no progress: never loop
    at = static_cast<std::uintptr_t>(arg.walk_end);
  }
  ::close(fd);
  out = sum;
  return ok;
}
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
    // EINVAL (nothing mapped there yet, as in fresh memory, or no MADV_COLLAPSE) and EAGAIN
    // (pinned or busy pages): this 2 MiB stays as it is; pages faulted in later come huge.
  }
  return r;
}

std::size_t huge_page_backed_bytes(const void* p, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  if (p == nullptr || bytes == 0 || begin + bytes < begin) return 0;
  std::size_t n = 0;
  if (scan_huge(begin, begin + bytes, n)) return std::min(n, bytes);
  return huge_page_backed_bytes_from_smaps(p, bytes);
}

std::size_t huge_page_backed_bytes_from_smaps(const void* p, std::size_t bytes) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  if (p == nullptr || bytes == 0 || begin + bytes < begin) return 0;
  const std::uintptr_t end = begin + bytes;
  std::FILE* f = std::fopen("/proc/self/smaps", "re");
  if (f == nullptr) return 0;
  char line[256];
  std::size_t sum = 0;
  std::size_t in_range = 0;  // the current mapping's overlap with [begin, end)
  bool line_start = true;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const bool whole = line_start;
    line_start = std::strchr(line, '\n') != nullptr;
    if (!whole) continue;  // the rest of a long line (a mapping's path)
    const char c = line[0];
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) {  // "lo-hi perms offset dev inode path"
      unsigned long long lo = 0;
      unsigned long long hi = 0;
      if (std::sscanf(line, "%llx-%llx", &lo, &hi) != 2) continue;
      if (lo >= end) break;  // mappings are listed in address order
      in_range = overlap(lo, hi, begin, end);
    } else if (in_range > 0 && std::strncmp(line, "AnonHugePages:", 14) == 0) {
      unsigned long long kib = 0;
      if (std::sscanf(line + 14, "%llu", &kib) == 1) sum += std::min<std::size_t>(kib * 1024, in_range);
    }
  }
  std::fclose(f);
  return std::min(sum, bytes);
}

bool transparent_huge_pages_enabled() noexcept {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
  if (f == nullptr) return false;
  char text[128] = {};
  const bool read = std::fgets(text, sizeof text, f) != nullptr;
  std::fclose(f);
  return read && std::strstr(text, "[never]") == nullptr;
}

}  // namespace spillway::detail
