// Tracing adaptor: a fixed-size ring of allocate/free/oom entries around an upstream resource.
// The ring is allocated once up front, so recording never allocates (and never throws).
#include "allocator/tracing_adaptor.hpp"

#include <algorithm>
#include <string>

#include "device/error.hpp"

namespace spillway {

const char* to_string(trace_entry::action a) noexcept {
  switch (a) {
    case trace_entry::action::alloc: return "alloc";
    case trace_entry::action::free: return "free";
    case trace_entry::action::oom: return "oom";
  }
  return "?";
}

tracing_adaptor::tracing_adaptor(device_memory_resource& upstream, std::size_t capacity) : upstream_(&upstream) {
  if (capacity == 0) throw config_error("tracing adaptor: the ring must hold at least one entry, got 0");
  ring_.resize(capacity);
}

void tracing_adaptor::record(trace_entry::action what, const void* ptr, std::size_t bytes, stream s) noexcept {
  std::lock_guard lock(mutex_);
  ring_[next_ % ring_.size()] = {what, reinterpret_cast<std::uintptr_t>(ptr), bytes, s.handle, next_};
  ++next_;
}

void* tracing_adaptor::do_allocate(std::size_t bytes, stream s) {
  try {
    void* p = upstream_->allocate(bytes, s);
    record(trace_entry::action::alloc, p, bytes, s);
    return p;
  } catch (const out_of_memory&) {
    record(trace_entry::action::oom, nullptr, bytes, s);
    throw;
  }
}

void tracing_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream s) noexcept {
  record(trace_entry::action::free, ptr, bytes, s);  // before: the address may be reused at once
  upstream_->deallocate(ptr, bytes, s);
}

std::vector<trace_entry> tracing_adaptor::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<trace_entry> out;
  const std::uint64_t n = std::min<std::uint64_t>(next_, ring_.size());
  out.reserve(n);
  for (std::uint64_t i = next_ - n; i < next_; ++i) out.push_back(ring_[i % ring_.size()]);
  return out;
}

std::uint64_t tracing_adaptor::recorded() const {
  std::lock_guard lock(mutex_);
  return next_;
}

}  // namespace spillway
