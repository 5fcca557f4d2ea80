// abstract_interface: the base of Spillway's abstract interfaces (Device, the memory resources,
// the I/O queues), whose objects own hardware or memory and are used through the interface.
#pragma once

namespace spillway {

/// Never copied (an object owns its memory, streams or rings); destroyed through the interface.
class abstract_interface {
 public:
  virtual ~abstract_interface() = default;
  abstract_interface(const abstract_interface&) = delete;
  abstract_interface& operator=(const abstract_interface&) = delete;

 protected:
  abstract_interface() = default;
};

}  // namespace spillway
