// A Session over a faulty_device (tests/device/faulty_device.hpp), through
// session_hooks::wrap_device, for tests that make its device calls fail on cue.
#pragma once

#include <memory>

#include "../device/faulty_device.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"

namespace spillway::test {

/// A Session with config `c` whose device is wrapped in a faulty_device; `*dev` is set to it (the
/// Session owns it).
inline std::unique_ptr<Session> session_over_faulty_device(const session_config& c, faulty_device*& dev) {
  session_hooks hooks;
  hooks.wrap_device = [&dev](std::unique_ptr<Device> d) {
    auto f = std::make_unique<faulty_device>(std::move(d));
    dev = f.get();
    return std::unique_ptr<Device>(std::move(f));
  };
  return std::make_unique<Session>(c, hooks);
}

}  // namespace spillway::test
