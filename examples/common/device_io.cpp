// Pinned staging of batch uploads and per-op kernel workspaces.
#include "examples/common/device_io.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "device/units.hpp"

namespace spillway::examples {

pinned_staging::~pinned_staging() { release(); }

void pinned_staging::release() noexcept {
  if (pinned_ == nullptr) return;
  try {
    if (done_) dev_->synchronize_event(*done_);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device has stopped its copies
  }
  done_.reset();
  dev_->deallocate_pinned(pinned_, bytes_);
  pinned_ = nullptr;
  bytes_ = 0;
}

void pinned_staging::upload(Device& dev, stream s, std::initializer_list<upload_part> parts) {
  constexpr std::size_t align = 256;
  std::size_t total = 0;
  for (const auto& p : parts) total += round_up(p.bytes, align);
  if (dev_ != &dev || total > bytes_) {
    release();
    dev_ = &dev;
    pinned_ = dev.allocate_pinned(total);
    bytes_ = total;
    done_ = std::make_unique<owned_event>(dev);
  }
  dev.synchronize_event(*done_);  // the last step's copies have left the buffer
  auto* at = static_cast<unsigned char*>(pinned_);
  for (const auto& p : parts) {
    std::memcpy(at, p.src, p.bytes);
    dev.copy_async(p.dst, at, p.bytes, copy_kind::host_to_device, s);
    at += round_up(p.bytes, align);
  }
  dev.record_event(*done_, s);
}

op_workspace::op_workspace(Session& s, std::string name, std::size_t bytes)
    : bytes_((std::max<std::size_t>(bytes, 256) + 255) / 256 * 256) {
  t_ = s.add_transient(std::move(name), bytes_, tensor_kind::workspace);
}

}  // namespace spillway::examples
