// Tests of the adaptors: statistics (counts and rollback), limit (refusal and rollback) and
// tracing (bounded ring, oldest first). The conformance suite covers their common contract.
#include <gtest/gtest.h>

#include "allocator/device_resource.hpp"
#include "allocator/limit_adaptor.hpp"
#include "allocator/statistics_adaptor.hpp"
#include "allocator/tracing_adaptor.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {
std::unique_ptr<Device> cpu() {
  device_options o;
  o.cpu_device_memory = 64_MiB;
  return make_device("cpu", o);
}
}  // namespace

TEST(StatisticsAdaptor, CountsAndRollsBackWhenUpstreamRefuses) {
  auto dev = cpu();
  owned_stream s(*dev);
  device_resource up(*dev);
  statistics_adaptor st(up);
  void* a = st.allocate(1_MiB, s);
  void* b = st.allocate(2_MiB, s);
  EXPECT_EQ(st.stats().current_bytes, static_cast<std::int64_t>(3_MiB));
  EXPECT_EQ(st.stats().current_count, 2);
  EXPECT_THROW((void)st.allocate(63_MiB, s), out_of_memory);
  EXPECT_EQ(st.stats().current_bytes, static_cast<std::int64_t>(3_MiB)) << "rolled back";
  EXPECT_EQ(st.stats().total_count, 2);
  st.deallocate(a, 1_MiB, s);
  st.deallocate(b, 2_MiB, s);
  const auto c = st.stats();
  EXPECT_EQ(c.current_bytes, 0);
  EXPECT_GE(c.peak_bytes, static_cast<std::int64_t>(3_MiB));
  EXPECT_EQ(c.total_bytes, static_cast<std::int64_t>(3_MiB));
}

TEST(LimitAdaptor, RefusesPastTheLimitWithADiagnosis) {
  auto dev = cpu();
  owned_stream s(*dev);
  device_resource up(*dev);
  limit_adaptor lim(up, 4_MiB);
  void* a = lim.allocate(3_MiB, s);
  try {
    (void)lim.allocate(2_MiB, s);
    FAIL();
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("limit 4.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("in use 3.00 MiB"), std::string::npos) << m;
  }
  EXPECT_EQ(lim.used(), 3_MiB);
  void* b = lim.allocate(1_MiB, s);
  lim.deallocate(a, 3_MiB, s);
  lim.deallocate(b, 1_MiB, s);
  EXPECT_EQ(lim.used(), 0u);
  EXPECT_THROW(limit_adaptor(up, 0), config_error);
}

TEST(TracingAdaptor, KeepsTheLastEntriesOldestFirst) {
  auto dev = cpu();
  owned_stream s(*dev);
  device_resource up(*dev);
  tracing_adaptor tr(up, 3);
  void* a = tr.allocate(1000, s);
  tr.deallocate(a, 1000, s);
  void* b = tr.allocate(2000, s);
  EXPECT_THROW((void)tr.allocate(1_GiB, s), out_of_memory);
  tr.deallocate(b, 2000, s);
  const auto e = tr.entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(tr.recorded(), 5u);
  EXPECT_EQ(e[0].what, trace_entry::action::alloc);
  EXPECT_EQ(e[0].size, 2000u);
  EXPECT_EQ(e[1].what, trace_entry::action::oom);
  EXPECT_EQ(e[2].what, trace_entry::action::free);
  EXPECT_EQ(e[2].address, reinterpret_cast<std::uintptr_t>(b));
  EXPECT_EQ(e[2].sequence, 4u);
  EXPECT_STREQ(to_string(e[1].what), "oom");
  EXPECT_THROW(tracing_adaptor(up, 0), config_error);
}
