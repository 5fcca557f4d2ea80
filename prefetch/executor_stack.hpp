// executor_stack: an executor with everything it stands on, built in the one right order: the
// arena over the device budget (its one owner, allocator/device_budget.hpp), the pinned host pool,
// the host tier, the optional NVMe tier and the tier backing. Members go in reverse order, the
// executor (and its streams) first.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "allocator/arena_allocator.hpp"
#include "allocator/device_budget.hpp"
#include "allocator/device_resource.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_tier.hpp"

namespace spillway {

struct executor_stack_options {
  std::uint64_t device_budget = 0;        ///< bytes of the arena and the executor's budget (> 0)
  std::uint64_t host_budget = 0;          ///< host tier capacity; 0 = no limit
  std::optional<nvme_options> nvme;       ///< the NVMe tier, when swap directories are given
  bool timeline = false;                  ///< record the executor's timeline
};

class executor_stack {
 public:
  executor_stack(Device& device, executor_stack_options options)
      : upstream_(device),
        memory_(device, upstream_, spillway::device_budget(options.device_budget)),
        pool_(device, pool_options()),
        host_(pool_, options.host_budget),
        nvme_(options.nvme ? std::make_unique<nvme_tier>(*options.nvme, &pool_) : nullptr),
        backing_(device, host_, nvme_.get()),
        exec_(device, memory_, backing_, executor_options_for(options)) {}

  [[nodiscard]] executor& exec() noexcept { return exec_; }
  [[nodiscard]] arena_allocator& memory() noexcept { return memory_; }
  /// The budget in force: the arena's, which the executor keeps within.
  [[nodiscard]] const spillway::device_budget& budget() const noexcept { return memory_.budget(); }
  /// Between iterations: every tensor leaves the device for its tier, and the arena is reserved
  /// again for `budget` (a config_error when the device cannot hold it; the old arena then stays).
  void set_device_budget(spillway::device_budget budget) {
    budget.check_fits(exec_.device());
    exec_.leave_device();
    memory_.set_budget(budget);
  }
  [[nodiscard]] nvme_tier* nvme() noexcept { return nvme_.get(); }
  [[nodiscard]] pinned_host_pool& pool() noexcept { return pool_; }

 private:
  static pinned_pool_options pool_options() {
    pinned_pool_options po;
    po.region_size = std::size_t{64} << 20;
    return po;
  }
  static executor_options executor_options_for(const executor_stack_options& o) {
    executor_options eo;
    eo.spill_tier = tier::host;
    eo.timeline = o.timeline;
    return eo;
  }

  device_resource upstream_;
  arena_allocator memory_;
  pinned_host_pool pool_;
  host_tier host_;
  std::unique_ptr<nvme_tier> nvme_;
  tier_backing backing_;
  executor exec_;
};

}  // namespace spillway
