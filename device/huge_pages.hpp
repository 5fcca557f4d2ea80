// Huge pages for I/O buffers: asks the kernel to back a buffer with transparent huge pages,
// so that a block's DMA is a few physically contiguous segments instead of one per 4 KiB page.
// See Note [Huge pages for registered buffers] in huge_pages.cpp.
#pragma once

#include <cstddef>

namespace spillway::detail {

/// What back_with_huge_pages did to one buffer (all SUM of bytes).
struct huge_page_result {
  std::size_t advised = 0;    ///< bytes marked for huge pages (the 2 MiB-aligned interior)
  std::size_t collapsed = 0;  ///< bytes whose existing pages were collapsed into huge pages
};

/// Marks the 2 MiB-aligned interior of [p, p + bytes) for transparent huge pages
/// (MADV_HUGEPAGE) and collapses the pages already there (MADV_COLLAPSE). Contents are kept;
/// pages the kernel cannot move (pinned by a driver, or already registered with io_uring) are
/// left as they are. Best effort: never throws, never fails the caller.
huge_page_result back_with_huge_pages(void* p, std::size_t bytes) noexcept;

}  // namespace spillway::detail
