// Huge pages for I/O buffers: asks the kernel to back a buffer with transparent huge pages,
// so that a block's DMA is a few physically contiguous segments instead of one per 4 KiB page,
// and measures how much of a buffer huge pages actually back.
// See Note [Huge pages for registered buffers] and Note [Measuring huge-page backing] in
// huge_pages.cpp.
#pragma once

#include <cstddef>

namespace spillway::detail {

/// What back_with_huge_pages did to one buffer (all SUM of bytes). Neither says that huge pages
/// back the buffer: use huge_page_backed_bytes for that.
struct huge_page_result {
  std::size_t advised = 0;    ///< bytes marked MADV_HUGEPAGE (the 2 MiB-aligned interior)
  std::size_t collapsed = 0;  ///< bytes whose pages already there were collapsed into huge pages
};

/// Marks the 2 MiB-aligned interior of [p, p + bytes) for transparent huge pages
/// (MADV_HUGEPAGE) and collapses the pages already there (MADV_COLLAPSE). Contents are kept.
/// Call it on fresh memory before it is touched or pinned: the pages faulted in later (by the
/// first write, or by pinning) then come as huge pages, and `collapsed` is 0 as there is
/// nothing to collapse. Pages the kernel cannot move (already pinned by a driver or registered
/// with io_uring) are left as they are. Best effort: never throws, never fails the caller.
huge_page_result back_with_huge_pages(void* p, std::size_t bytes) noexcept;

/// Bytes of [p, p + bytes) that are now mapped by huge pages (PMD-mapped transparent huge pages,
/// or hugetlb pages where the kernel's page scan is used). Pages not faulted in yet count as
/// not backed. Exact on Linux 6.7 and later; an estimate from /proc/self/smaps before that
/// (Note [Measuring huge-page backing]). 0 for a null or empty range, or when neither source
/// can be read. Never more than `bytes`. Reads /proc: tens of microseconds per call at least,
/// meant for setup and statistics, not per I/O.
std::size_t huge_page_backed_bytes(const void* p, std::size_t bytes) noexcept;

/// The /proc/self/smaps estimate that huge_page_backed_bytes falls back to on kernels without
/// PAGEMAP_SCAN; exposed so tests can check it where the exact method exists.
std::size_t huge_page_backed_bytes_from_smaps(const void* p, std::size_t bytes) noexcept;

/// False when the kernel has no transparent huge pages or they are switched off
/// (/sys/kernel/mm/transparent_hugepage/enabled missing or set to [never]).
bool transparent_huge_pages_enabled() noexcept;

}  // namespace spillway::detail
