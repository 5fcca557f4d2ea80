// tensor_store: the bookkeeping of where tensors are and the moves that chain device copies
// and file I/O. See Note [Waiting on a device stream] and Note [Source release].
#include "swap/tensor_store.hpp"

#include "device/error.hpp"

namespace spillway {

// Note [Waiting on a device stream]
// Host functions of every stream share one callback thread and may neither call the Device nor
// wait (device/device.hpp), so no move uses one. A move that copies onto or off the device
// records an event right after the copy; the work that must follow the copy on the host (a
// free, the NVMe write of a staged tensor, the bookkeeping that ends the move) runs on the
// store's worker thread once the device reaches that event (event_worker). From NVMe to the
// device, the read's completion (an I/O thread) enqueues the H2D copy on the caller's stream
// and records the event; a handle's stream_wait() waits on the caller's thread until then, and
// then on the device. Moves that end in file I/O have no event: stream_wait() waits for them on
// the caller's thread.
//
// Note [Source release]
// Every completion path first makes the destination authoritative, then frees the source:
// device -> host: the copy is done when the device reaches the event after it;
// host -> nvme: the host block is freed in the write's completion, after every block's CQE
// reported the full length; nvme -> host/device: the NVMe blocks are erased only after every
// block's CRC matched. A failure at any step frees what was allocated for the destination and
// leaves the entry as it was.

const char* to_string(tier t) noexcept {
  switch (t) {
    case tier::device: return "device";
    case tier::host: return "host";
    case tier::nvme: return "nvme";
  }
  return "?";
}

tensor_store::tensor_store(Device& device, host_tier& host, nvme_tier* nvme)
    : device_(device), host_(host), nvme_(nvme), marks_(std::make_shared<event_pool>(device)) {}

tensor_store::~tensor_store() {
  wait_idle();
  for (auto& [name, e] : tensors_) {
    if (e.where == tier::host) host_.deallocate(e.host, e.bytes);
    if (e.where == tier::nvme && nvme_ != nullptr && nvme_->contains(name)) nvme_->erase(name);
  }
}

void tensor_store::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [this] { return in_flight_ == 0; });
}

const tensor_store::entry& tensor_store::find(const std::string& name) const {
  auto it = tensors_.find(name);
  SPILLWAY_EXPECTS(it != tensors_.end(), "tensor store: no tensor '" + name + "'");
  return it->second;
}

void tensor_store::add_on_device(const std::string& name, std::size_t bytes, void* device_ptr) {
  SPILLWAY_EXPECTS(device_ptr != nullptr || bytes == 0, "tensor store: tensor '" + name + "' has a null device pointer");
  std::lock_guard lock(mutex_);
  SPILLWAY_EXPECTS(tensors_.find(name) == tensors_.end(), "tensor store: tensor '" + name + "' already exists");
  auto& e = tensors_[name];
  e.bytes = bytes;
  e.where = tier::device;
  e.device = device_ptr;
}

void* tensor_store::add_on_host(const std::string& name, std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    SPILLWAY_EXPECTS(tensors_.find(name) == tensors_.end(), "tensor store: tensor '" + name + "' already exists");
  }
  void* p = host_.allocate(name, bytes);
  std::lock_guard lock(mutex_);
  auto [it, fresh] = tensors_.try_emplace(name);
  if (!fresh) {
    host_.deallocate(p, bytes);
    throw error("tensor store: tensor '" + name + "' already exists");
  }
  it->second.bytes = bytes;
  it->second.where = tier::host;
  it->second.host = p;
  return p;
}

void tensor_store::remove(const std::string& name) {
  entry e;
  {
    std::lock_guard lock(mutex_);
    auto it = tensors_.find(name);
    SPILLWAY_EXPECTS(it != tensors_.end(), "tensor store: no tensor '" + name + "'");
    SPILLWAY_EXPECTS(!it->second.moving, "tensor store: tensor '" + name + "' cannot be removed while it moves");
    e = std::move(it->second);
    tensors_.erase(it);
  }
  if (e.where == tier::host) host_.deallocate(e.host, e.bytes);
  if (e.where == tier::nvme && nvme_ != nullptr) nvme_->erase(name);
}

bool tensor_store::contains(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return tensors_.find(name) != tensors_.end();
}

tier tensor_store::where(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return find(name).where;
}

bool tensor_store::moving(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return find(name).moving;
}

std::size_t tensor_store::bytes(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return find(name).bytes;
}

void* tensor_store::device_ptr(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto& e = find(name);
  SPILLWAY_EXPECTS(!e.moving, "tensor store: tensor '" + name + "' is moving");
  return e.where == tier::device ? e.device : nullptr;
}

void* tensor_store::host_ptr(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto& e = find(name);
  SPILLWAY_EXPECTS(!e.moving, "tensor store: tensor '" + name + "' is moving");
  return e.where == tier::host ? e.host : nullptr;
}

nvme_tier& tensor_store::need_nvme(const std::string& name) const {
  SPILLWAY_EXPECTS_T(config_error, nvme_ != nullptr, "tensor store: tensor '" + name + "' cannot move to or from NVMe: the store has no NVMe tier");
  return *nvme_;
}

move_handle tensor_store::ready_handle() {
  auto state = std::make_shared<detail::move_state>();
  state->finish(nullptr);
  return move_handle(state);
}

tensor_store::entry& tensor_store::begin_move(const std::string& name) {
  auto it = tensors_.find(name);
  SPILLWAY_EXPECTS(it != tensors_.end(), "tensor store: no tensor '" + name + "'");
  SPILLWAY_EXPECTS(!it->second.moving, "tensor store: tensor '" + name + "' is already moving");
  it->second.moving = true;
  ++in_flight_;
  return it->second;
}

void tensor_store::abort_move(const std::string& name) noexcept {
  std::lock_guard lock(mutex_);
  tensors_.at(name).moving = false;
  --in_flight_;
  idle_cv_.notify_all();
}

void tensor_store::end_move(const std::string& name, tier where, void* device, void* host,
                            const std::shared_ptr<detail::move_state>& state, std::exception_ptr error) noexcept {
  {
    std::lock_guard lock(mutex_);
    auto& e = tensors_.at(name);
    if (!error) {
      e.where = where;
      e.device = device;
      e.host = host;
    }
    e.moving = false;
  }
  state->finish(std::move(error));
  std::lock_guard lock(mutex_);  // last: the store may be destroyed once in_flight_ is 0
  --in_flight_;
  idle_cv_.notify_all();
}

move_handle tensor_store::to_host(const std::string& name, stream s) {
  tier from{};
  std::size_t n = 0;
  void* src = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (find(name).where == tier::host && !find(name).moving) return ready_handle();
    auto& e = begin_move(name);
    from = e.where;
    n = e.bytes;
    src = e.device;
  }
  void* dst = nullptr;
  try {
    if (from == tier::nvme) need_nvme(name);
    dst = host_.allocate(name, n);
  } catch (...) {
    abort_move(name);
    throw;
  }
  auto state = std::make_shared<detail::move_state>();
  if (from == tier::device) {
    std::shared_ptr<detail::device_mark> mark;
    try {
      mark = detail::make_mark(marks_);
      device_.copy_async(dst, src, n, copy_kind::device_to_host, s);
      mark->record(s);
    } catch (...) {
      host_.deallocate(dst, n);
      abort_move(name);
      throw;
    }
    worker_.after(mark, [this, name, dst, n, state](std::exception_ptr err) {
      if (err) host_.deallocate(dst, n);
      end_move(name, tier::host, nullptr, dst, state, err);
    });
    return move_handle(state, mark);
  }
  // from NVMe: read into the new host block; erase the NVMe copy once verified.
  try {
    (void)nvme_->read(name, dst, host_.footprint(n), [this, name, dst, n, state](std::exception_ptr err) {
      if (err) {
        host_.deallocate(dst, n);
      } else {
        nvme_->erase(name);
      }
      end_move(name, tier::host, nullptr, dst, state, err);
    });
  } catch (...) {
    host_.deallocate(dst, n);
    abort_move(name);
    throw;
  }
  return move_handle(state);
}

move_handle tensor_store::to_nvme(const std::string& name, stream s) {
  tier from{};
  std::size_t n = 0;
  void* src = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (find(name).where == tier::nvme && !find(name).moving) return ready_handle();
    need_nvme(name);
    auto& e = begin_move(name);
    from = e.where;
    n = e.bytes;
    src = from == tier::host ? e.host : e.device;
  }
  auto state = std::make_shared<detail::move_state>();
  if (from == tier::host) {
    try {
      (void)nvme_->write(name, src, n, host_.footprint(n), [this, name, src, n, state](std::exception_ptr err) {
        if (!err) host_.deallocate(src, n);
        end_move(name, tier::nvme, nullptr, err ? src : nullptr, state, err);
      });
    } catch (...) {
      abort_move(name);
      throw;
    }
    return move_handle(state);
  }
  // from the device: D2H into a staging block; the worker starts the write once it is there.
  void* staging = nullptr;
  std::shared_ptr<detail::device_mark> mark;
  try {
    staging = host_.allocate(name, n);
    mark = detail::make_mark(marks_);
    device_.copy_async(staging, src, n, copy_kind::device_to_host, s);
    mark->record(s);
  } catch (...) {
    if (staging != nullptr) host_.deallocate(staging, n);
    abort_move(name);
    throw;
  }
  worker_.after(mark, [this, name, staging, src, n, state](std::exception_ptr device_error) {
    auto done = [this, name, staging, src, n, state](std::exception_ptr err) {
      host_.deallocate(staging, n);  // on the worker or an I/O thread, never in stream work
      end_move(name, tier::nvme, err ? src : nullptr, nullptr, state, err);
    };
    if (device_error) {
      done(device_error);
      return;
    }
    try {
      (void)nvme_->write(name, staging, n, host_.footprint(n), done);
    } catch (...) {
      done(std::current_exception());
    }
  });
  return move_handle(state);  // ends in file I/O: no device event
}

move_handle tensor_store::to_device(const std::string& name, void* dst, stream s) {
  tier from{};
  std::size_t n = 0;
  void* src = nullptr;
  {
    std::lock_guard lock(mutex_);
    const auto& cur = find(name);
    if (cur.where == tier::device && !cur.moving) {
      SPILLWAY_EXPECTS(dst == cur.device || dst == nullptr,
                       "tensor store: tensor '" + name + "' is already on the device at another address");
      return ready_handle();
    }
    SPILLWAY_EXPECTS(dst != nullptr || cur.bytes == 0, "tensor store: tensor '" + name + "' moved to a null device pointer");
    auto& e = begin_move(name);
    from = e.where;
    n = e.bytes;
    src = e.host;
  }
  auto state = std::make_shared<detail::move_state>();
  std::shared_ptr<detail::device_mark> mark;
  try {
    mark = detail::make_mark(marks_);  // recorded right after the H2D copy
  } catch (...) {
    abort_move(name);
    throw;
  }
  if (from == tier::host) {
    try {
      device_.copy_async(dst, src, n, copy_kind::host_to_device, s);
      mark->record(s);
    } catch (...) {
      abort_move(name);
      throw;
    }
    worker_.after(mark, [this, name, src, dst, n, state](std::exception_ptr err) {
      if (!err) host_.deallocate(src, n);
      end_move(name, tier::device, dst, nullptr, state, err);
    });
    return move_handle(state, mark);
  }
  // from NVMe: read into staging now; the read's completion (an I/O thread) enqueues the H2D
  // copy on s and records the event, and the worker ends the move once the copy is done.
  void* staging = nullptr;
  try {
    need_nvme(name);
    staging = host_.allocate(name, n);
    (void)nvme_->read(name, staging, host_.footprint(n), [this, name, staging, dst, n, s, mark, state](std::exception_ptr err) {
      if (!err) {
        try {
          device_.copy_async(dst, staging, n, copy_kind::host_to_device, s);
          mark->record(s);
        } catch (...) {
          err = std::current_exception();
        }
      }
      if (err) {
        mark->abandon();
        host_.deallocate(staging, n);
        end_move(name, tier::device, dst, nullptr, state, err);
        return;
      }
      worker_.after(mark, [this, name, staging, dst, n, state](std::exception_ptr derr) {
        host_.deallocate(staging, n);
        if (!derr) {
          try {
            nvme_->erase(name);
          } catch (...) {
            derr = std::current_exception();
          }
        }
        end_move(name, tier::device, dst, nullptr, state, derr);
      });
    });
  } catch (...) {
    mark->abandon();
    if (staging != nullptr) host_.deallocate(staging, n);
    abort_move(name);
    throw;
  }
  return move_handle(state, mark);
}

}  // namespace spillway
