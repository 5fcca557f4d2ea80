// tier_backing: the executor's tensor_backing over the swap tiers (host tier, optional NVMe
// tier), and the one mover between device memory and the tiers: the executor stack (which
// Session runs) and spillway-bench tiers use it. A load keeps the tier copy, so a tensor that
// comes back to the device unchanged can later leave it again without any copy (a "drop").
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "prefetch/tensor_backing.hpp"
#include "swap/event_worker.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_tier.hpp"

namespace spillway {

class tier_backing final : public tensor_backing {
 public:
  /// `nvme` may be null: then everything that leaves the device stays on the host tier.
  tier_backing(Device& device, host_tier& host, nvme_tier* nvme);
  ~tier_backing() override;

  move_handle save(tensor_id id, const std::string& name, const void* src, std::uint64_t bytes, tier to,
                   stream s) override;
  move_handle load(tensor_id id, const std::string& name, void* dst, std::uint64_t bytes, stream s) override;
  void put(tensor_id id, const std::string& name, const void* host, std::uint64_t bytes, tier to) override;
  void get(tensor_id id, const std::string& name, void* host, std::uint64_t bytes) override;
  [[nodiscard]] void* host_copy(tensor_id id, const std::string& name, std::uint64_t bytes) override;
  [[nodiscard]] std::optional<tier> where(tensor_id id) const override;
  void keep_io_spans(bool on) override { keep_spans_ = on; }
  [[nodiscard]] std::vector<io_span> take_io_spans() override;
  [[nodiscard]] std::vector<copy_span> take_copy_spans() override;
  void discard(tensor_id id) override;
  void drain() override;
  [[nodiscard]] backing_counters counters() const override;

 private:
  struct copy {
    std::optional<tier> where;  // none: no copy
    void* host = nullptr;       // host-tier block, or a staging block kept after a failed write
    std::uint64_t bytes = 0;
    bool staging = false;       // `host` came from the pool directly, not the host tier
    std::string nvme_name;
    std::vector<move_handle> in_flight;
  };
  copy& slot(tensor_id id);                    // under mutex_
  std::exception_ptr settle(tensor_id id);     // waits for id's moves (the first one's error); not under mutex_
  void free_copy(copy& c);                     // under mutex_
  void retire(copy& c);                        // under mutex_: frees c's copy, or keeps it until its moves end
  void free_settled();                         // under mutex_: frees the oldest retired copies no move uses now
  void free_all_settled();                     // under mutex_: frees every retired copy no move uses now
  void* allocate_host(const std::string& name, std::uint64_t bytes, std::unique_lock<std::mutex>& lock);
  /// `e` (the host tier is full, and there is no NVMe tier) with what `name` cannot do and what to change.
  out_of_memory no_room(const out_of_memory& e, const std::string& name, std::uint64_t bytes, const char* what) const;
  void* staging_block(std::uint64_t bytes);
  void free_staging(void* p, std::uint64_t bytes) noexcept;
  void write_staged(tensor_id id, const std::string& name, const std::string& file_name, void* staging,
                    std::uint64_t bytes, const std::shared_ptr<detail::move_state>& state, std::exception_ptr device_error);
  void copy_then_mark(void* dst, const void* src, std::uint64_t bytes, copy_kind kind, stream s,
                      detail::device_mark& mark, bool& enqueued, const std::function<void()>& before_mark = {});
  void forget_failed_save(tensor_id id, void* block, bool staging, bool enqueued) noexcept;
  void copy_out(tensor_id id, void* dst, bool staging, const void* src, std::uint64_t bytes, stream s,
                detail::device_mark& mark, detail::move_state& state);
  void land(const std::string& name, void* dst, void* staging, std::uint64_t bytes, stream s, const std::shared_ptr<detail::device_mark>& mark,
            const std::shared_ptr<detail::move_state>& state, std::exception_ptr err);
  void note_io(bool write, const std::string& name, std::chrono::steady_clock::time_point start);
  [[nodiscard]] std::size_t capacity_of(std::uint64_t bytes) const noexcept;

  Device& device_;
  host_tier& host_;
  nvme_tier* nvme_;
  mutable std::mutex mutex_;
  std::atomic<bool> keep_spans_{false};
  std::mutex spans_mutex_;
  std::vector<io_span> spans_;
  std::vector<copy_span> copy_spans_;  // under spans_mutex_
  std::vector<copy> copies_;
  std::vector<copy> retired_;  // superseded copies that moves still read or write (Note [Retired copies])
  backing_counters counters_;
  std::uint64_t generation_ = 0;
  std::shared_ptr<event_pool> marks_;  // the events of this mover's device marks
  event_worker worker_;  // last: its jobs use the members above, and it is joined first
};

}  // namespace spillway
