// Checkpoints: the file unit (offload/checkpoint.hpp) and Session::save/load. Round trips with
// tensors on the device, the host tier and the NVMe tier; every kind of mismatch and a flipped
// byte refused by name with no tensor changed; a save killed midway (fork + SIGKILL) leaves the
// previous checkpoint loadable; a save that succeeds leaves no temporary file.
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/checkpoint.hpp"
#include "offload/swap_policy.hpp"
#include "swap/crc32c.hpp"
#include "../swap/swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
namespace ck = spillway::checkpoint;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// Bytes of tensor `i` in "generation" `g`.
std::vector<unsigned char> pattern(std::uint64_t bytes, int i, int g) {
  return test::random_bytes(bytes, static_cast<std::uint64_t>(i) * 1000 + static_cast<std::uint64_t>(g));
}

/// A source over host vectors, handing each one over in chunks of `chunk` bytes.
ck::tensor_source source_of(const std::vector<std::vector<unsigned char>>& data, std::uint64_t chunk) {
  return [&data, chunk](std::size_t i, const ck::chunk_sink& sink) {
    for (std::uint64_t at = 0; at < data[i].size(); at += chunk)
      sink(data[i].data() + at, std::min<std::uint64_t>(chunk, data[i].size() - at));
  };
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

std::string checkpoint_path(const std::string& dir) { return dir + "/" + std::string(ck::file_name); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void put_le(std::string& b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const std::string& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)])} << (8 * i);
  return v;
}

/// Rewrites a checkpoint file of format 2 as format `version` (Note [Checkpoint format]): for 1,
/// its index without the Session's state; the CRCs of the index and the header made again.
void rewrite_as_format(const std::string& path, std::uint32_t version) {
  std::string b = file_bytes(path);
  const auto index_offset = get_le(b, 16, 8), index_bytes = get_le(b, 24, 8);
  ASSERT_EQ(index_offset + index_bytes, b.size());
  if (version == 1) {
    b.resize(b.size() - 8);  // the iteration count, the index's last field
    put_le(b, 24, index_bytes - 8, 8);
  }
  put_le(b, 8, version, 4);
  put_le(b, 32, crc32c(b.data() + index_offset, b.size() - index_offset), 4);
  put_le(b, 36, crc32c(b.data(), 36), 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

// ---- the file unit ----

TEST(CheckpointFile, RoundTripInChunksWithMetaAndNoTemporaryLeft) {
  test::temp_dir dir;
  const std::vector<ck::entry> entries{{"w", 100'003, tensor_kind::parameter},
                                       {"w.grad", 100'003, tensor_kind::gradient},
                                       {"m", 1, tensor_kind::optimizer_state},
                                       {"big", 3_MiB + 5, tensor_kind::parameter}};
  std::vector<std::vector<unsigned char>> data;
  for (std::size_t i = 0; i < entries.size(); ++i) data.push_back(pattern(entries[i].bytes, static_cast<int>(i), 1));
  ck::write(dir.path(), entries, source_of(data, 7777), "step 42\nseed 7");
  EXPECT_EQ(files_in(dir.path()), std::set<std::string>{std::string(ck::file_name)});
  const ck::reader r(dir.path());
  EXPECT_EQ(r.meta(), "step 42\nseed 7");
  ASSERT_EQ(r.entries().size(), entries.size());
  r.check_matches(entries, "the test's tensors");
  r.verify();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::vector<unsigned char> back(entries[i].bytes);
    r.read(entries[i].name, back.data());
    EXPECT_EQ(back, data[i]) << entries[i].name;
  }
}

// The Session's state (the iterations it had ended) comes back as saved; a file of format 1,
// written before the format kept it, still reads, tensors and meta whole, with no state; a format
// this Spillway does not know is refused naming the formats it reads.
TEST(CheckpointFile, KeepsTheSessionsStateAndReadsFormatOneWithout) {
  test::temp_dir dir;
  const std::vector<ck::entry> entries{{"w", 1000, tensor_kind::parameter}, {"m", 24, tensor_kind::optimizer_state}};
  std::vector<std::vector<unsigned char>> data{pattern(1000, 0, 3), pattern(24, 1, 3)};
  ck::write(dir.path(), entries, source_of(data, 100), "step 9", {}, ck::session_state{0x1234'5678'9abcULL});
  {
    const ck::reader r(dir.path());
    ASSERT_TRUE(r.state().has_value());
    EXPECT_EQ(r.state()->iterations, 0x1234'5678'9abcULL);
  }
  rewrite_as_format(checkpoint_path(dir.path()), 1);
  {
    const ck::reader r(dir.path());
    EXPECT_FALSE(r.state().has_value()) << "a format 1 file has no Session state to give";
    EXPECT_EQ(r.meta(), "step 9");
    r.check_matches(entries, "the test's tensors");
    r.verify();
    std::vector<unsigned char> back(1000);
    r.read("w", back.data());
    EXPECT_EQ(back, data[0]);
  }
  rewrite_as_format(checkpoint_path(dir.path()), 3);
  try {
    const ck::reader r(dir.path());
    FAIL() << "a format 3 file was read";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "has format 3; this Spillway reads formats 1 to 2")) << e.what();
  }
}

TEST(CheckpointFile, MakesAMissingFolderButNotItsParent) {
  test::temp_dir dir;
  const std::vector<ck::entry> entries{{"w", 16, tensor_kind::parameter}};
  const std::vector<std::vector<unsigned char>> data{pattern(16, 0, 0)};
  ck::write(dir.path() + "/run1", entries, source_of(data, 16), "");
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(dir.path() + "/run1")));
  try {
    ck::write(dir.path() + "/no/such", entries, source_of(data, 16), "");
    FAIL() << "a folder whose parent is missing was accepted";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), dir.path() + "/no/such")) << e.what();
  }
}

TEST(CheckpointFile, EachMismatchIsNamed) {
  test::temp_dir dir;
  const std::vector<ck::entry> saved{{"a", 64, tensor_kind::parameter}, {"b", 128, tensor_kind::gradient}};
  const std::vector<std::vector<unsigned char>> data{pattern(64, 0, 0), pattern(128, 1, 0)};
  ck::write(dir.path(), saved, source_of(data, 64), "");
  const ck::reader r(dir.path());
  auto refusal = [&](const std::vector<ck::entry>& expected) -> std::string {
    try {
      r.check_matches(expected, "the test's tensors");
    } catch (const config_error& e) {
      return e.what();
    }
    return "accepted";
  };
  auto missing = saved;
  missing.push_back({"c", 8, tensor_kind::optimizer_state});
  const std::string m = refusal(missing);
  EXPECT_TRUE(has(m, "no tensor \"c\"")) << m;
  auto size = saved;
  size[1].bytes = 256;
  const std::string s = refusal(size);
  EXPECT_TRUE(has(s, "\"b\" has 128 bytes there and 256")) << s;
  auto kind = saved;
  kind[0].kind = tensor_kind::optimizer_state;
  const std::string k = refusal(kind);
  EXPECT_TRUE(has(k, "\"a\" is of kind parameter there and optimizer_state")) << k;
  const std::string x = refusal({saved[0]});
  EXPECT_TRUE(has(x, "has tensor \"b\"") && has(x, "not among the test's tensors")) << x;
}

TEST(CheckpointFile, DamageIsCaughtAndNamed) {
  test::temp_dir dir;
  const std::vector<ck::entry> entries{{"first", 4096, tensor_kind::parameter}, {"second", 4096, tensor_kind::parameter}};
  const std::vector<std::vector<unsigned char>> data{pattern(4096, 0, 0), pattern(4096, 1, 0)};
  ck::write(dir.path(), entries, source_of(data, 4096), "meta");
  const std::string path = checkpoint_path(dir.path());
  flip_byte(path, 64 + 4096 + 100);  // inside "second"
  {
    const ck::reader r(dir.path());
    try {
      r.verify();
      FAIL() << "a flipped byte passed";
    } catch (const corruption_error& e) {
      EXPECT_TRUE(has(e.what(), "\"second\"") && has(e.what(), path)) << e.what();
    }
    std::vector<unsigned char> back(4096);
    r.read("first", back.data());  // the other tensor still reads
    EXPECT_EQ(back, data[0]);
  }
  flip_byte(path, 64 + 4096 + 100);
  flip_byte(path, std::filesystem::file_size(path) - 3);  // inside the index
  EXPECT_THROW(ck::reader{dir.path()}, corruption_error);
  flip_byte(path, std::filesystem::file_size(path) - 3);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);  // cut short
  EXPECT_THROW(ck::reader{dir.path()}, corruption_error);
  std::ofstream(path) << "not a checkpoint at all";
  EXPECT_THROW(ck::reader{dir.path()}, config_error);
  std::filesystem::remove(path);
  try {
    ck::reader r(dir.path());
    FAIL() << "a folder without a checkpoint opened";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "no checkpoint in '" + dir.path() + "'")) << e.what();
  }
}

// A save killed midway (the process dies with the temporary file half written) leaves the
// previous checkpoint whole, and the next save removes the dead one's temporary file.
TEST(CheckpointFile, SaveKilledMidwayLeavesThePreviousCheckpoint) {
  test::temp_dir dir;
  std::vector<ck::entry> entries;
  std::vector<std::vector<unsigned char>> first, second;
  for (int i = 0; i < 4; ++i) {
    entries.push_back({"w" + std::to_string(i), 1_MiB, tensor_kind::parameter});
    first.push_back(pattern(1_MiB, i, 1));
    second.push_back(pattern(1_MiB, i, 2));
  }
  ck::write(dir.path(), entries, source_of(first, 64_KiB), "first");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the child: a save that stops, for good, after 2 MiB
    ::close(ready[0]);
    ck::write_options o;
    o.on_progress = [&](std::uint64_t bytes) {
      if (bytes < 2_MiB) return;
      const char x = 'x';
      (void)!::write(ready[1], &x, 1);
      for (;;) ::pause();
    };
    try {
      ck::write(dir.path(), entries, source_of(second, 64_KiB), "second", o);
    } catch (...) {
    }
    ::_exit(1);  // the save finished: the parent sees no signal and fails
  }
  ::close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  const int polled = ::poll(&p, 1, 20000);
  char x = 0;
  const bool signalled = polled == 1 && ::read(ready[0], &x, 1) == 1;
  ::close(ready[0]);
  bool temporary_seen = false;
  for (const auto& name : files_in(dir.path())) temporary_seen = temporary_seen || name.starts_with(ck::temp_prefix);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(signalled) << "the child's save never reached 2 MiB";
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(temporary_seen) << "the save was killed before it wrote its temporary file";
  {
    const ck::reader r(dir.path());
    EXPECT_EQ(r.meta(), "first");
    r.check_matches(entries, "the test's tensors");
    r.verify();
    std::vector<unsigned char> back(1_MiB);
    for (int i = 0; i < 4; ++i) {
      r.read(entries[i].name, back.data());
      EXPECT_EQ(back, first[i]) << entries[i].name;
    }
  }
  ck::write(dir.path(), entries, source_of(second, 1_MiB), "third");
  EXPECT_EQ(files_in(dir.path()), std::set<std::string>{std::string(ck::file_name)})
      << "the dead save's temporary file stayed";
  EXPECT_EQ(ck::reader(dir.path()).meta(), "third");
}

// ---- Session::save and Session::load ----

namespace {

session_config cpu_config(std::uint64_t budget) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.device_budget = budget;
  c.policy = "auto";
  c.link_gbps = 0;
  return c;
}

session_config nvme_config(const std::string& dir) {
  auto c = cpu_config(256_KiB);
  c.host_budget = 4_KiB;  // everything that leaves the device goes to NVMe
  c.nvme.directories = {dir};
  c.nvme.reserve = 16_MiB;
  return c;
}

/// A model of persistent tensors that each iteration updates in place (every byte += i + 1),
/// with the host's copy of what they hold.
struct updated_model {
  static constexpr int count = 6;
  static constexpr std::uint64_t bytes = 96_KiB;
  std::vector<tensor_handle> h;
  std::vector<std::vector<unsigned char>> expect;

  updated_model(Session& s, int generation) {
    for (int i = 0; i < count; ++i) {
      expect.push_back(pattern(bytes, i, generation));
      const auto kind = i % 3 == 0 ? tensor_kind::parameter : i % 3 == 1 ? tensor_kind::gradient : tensor_kind::optimizer_state;
      h.push_back(s.add_persistent("t" + std::to_string(i), bytes, kind, expect.back().data()));
    }
  }
  void iterate(Session& s) {
    s.begin_iteration();
    for (int i = 0; i < count; ++i) {
      auto scratch = s.add_transient("scratch" + std::to_string(i), 8_KiB);
      {
        auto op = s.op("update" + std::to_string(i), {h[i]}, {h[i], scratch});
        auto* p = op.ptr<unsigned char>(h[i]);
        const auto add = static_cast<unsigned char>(i + 1);
        op.device().launch_kernel(op.stream(), [p, add] {
          for (std::uint64_t b = 0; b < bytes; ++b) p[b] = static_cast<unsigned char>(p[b] + add);
        });
      }
      s.release(scratch);
      for (auto& c : expect[i]) c = static_cast<unsigned char>(c + i + 1);
    }
    s.end_iteration();
  }
  /// The index of the first tensor that does not hold `want`, or -1.
  int first_different(Session& s, const std::vector<std::vector<unsigned char>>& want) const {
    std::vector<unsigned char> back(bytes);
    for (int i = 0; i < count; ++i) {
      s.read(h[i], back.data(), back.size());
      if (back != want[i]) return i;
    }
    return -1;
  }
};

/// Saves after two iterations, changes the tensors, loads, and checks the values and that the
/// Session carries on from them; then loads the same checkpoint into a fresh Session.
void round_trip(const session_config& cfg, const std::string& dir, bool nvme) {
  std::vector<std::vector<unsigned char>> saved;
  {
    Session s(cfg);
    updated_model m(s, 1);
    m.iterate(s);
    m.iterate(s);
    const auto& last = s.history().back();
    EXPECT_GT(last.d2h_bytes, 0u) << "every tensor stayed on the device: the test does not reach a tier";
    if (nvme) {
      EXPECT_GT(last.nvme_write_bytes, 0u) << "nothing went to the NVMe tier";
    }
    s.save(dir, "after 2");
    saved = m.expect;
    EXPECT_EQ(files_in(dir), std::set<std::string>{std::string(ck::file_name)});
    m.iterate(s);
    EXPECT_EQ(m.first_different(s, saved), 0) << "the iteration after the save changed nothing";
    EXPECT_EQ(s.load(dir), "after 2");
    EXPECT_EQ(m.first_different(s, saved), -1);
    m.expect = saved;
    m.iterate(s);  // the Session carries on from the loaded values
    EXPECT_EQ(m.first_different(s, m.expect), -1);
  }
  Session fresh(cfg);
  updated_model m(fresh, 2);
  EXPECT_EQ(fresh.load(dir), "after 2");
  EXPECT_EQ(m.first_different(fresh, saved), -1);
  m.expect = saved;
  m.iterate(fresh);
  m.iterate(fresh);
  EXPECT_EQ(m.first_different(fresh, m.expect), -1);
}

}  // namespace

TEST(SessionCheckpoint, RoundTripWithTensorsOnTheDeviceAndTheHostTier) {
  test::temp_dir dir;
  round_trip(cpu_config(256_KiB), dir.path() + "/ck", false);  // 576 KiB of tensors under a 256 KiB budget
}

TEST(SessionCheckpoint, RoundTripWithTheNvmeTier) {
  test::temp_dir swap, dir;
  round_trip(nvme_config(swap.path()), dir.path(), true);
}

TEST(SessionCheckpoint, LoadRefusesEachMismatchAndChangesNothing) {
  test::temp_dir dir;
  {
    Session s(cpu_config(0));
    s.add_persistent("a", 4_KiB, tensor_kind::parameter, pattern(4_KiB, 0, 1).data());
    s.add_persistent("b", 8_KiB, tensor_kind::gradient, pattern(8_KiB, 1, 1).data());
    s.add_persistent("c", 4_KiB, tensor_kind::optimizer_state, pattern(4_KiB, 2, 1).data());
    s.save(dir.path());
  }
  struct variant {
    std::vector<ck::entry> tensors;
    std::string named;
  };
  const std::vector<variant> variants{
      {{{"a", 4_KiB, tensor_kind::parameter}, {"b", 8_KiB, tensor_kind::gradient}, {"c", 4_KiB, tensor_kind::optimizer_state},
        {"d", 4_KiB, tensor_kind::parameter}},
       "no tensor \"d\""},
      {{{"a", 4_KiB, tensor_kind::parameter}, {"b", 12_KiB, tensor_kind::gradient}, {"c", 4_KiB, tensor_kind::optimizer_state}},
       "\"b\" has 8192 bytes there and 12288"},
      {{{"a", 4_KiB, tensor_kind::parameter}, {"b", 8_KiB, tensor_kind::gradient}, {"c", 4_KiB, tensor_kind::parameter}},
       "\"c\" is of kind optimizer_state there and parameter"},
      // A gradient (or parameter) missing is another model; optimizer state missing waits for its
      // add (SessionCheckpoint.OptimizerStateAddedInTheFirstStepTakesItsValueFromTheCheckpoint).
      {{{"a", 4_KiB, tensor_kind::parameter}, {"c", 4_KiB, tensor_kind::optimizer_state}}, "has tensor \"b\""},
  };
  for (const auto& v : variants) {
    Session s(cpu_config(0));
    std::vector<tensor_handle> h;
    std::vector<std::vector<unsigned char>> init;
    for (std::size_t i = 0; i < v.tensors.size(); ++i) {
      init.push_back(pattern(v.tensors[i].bytes, static_cast<int>(i), 9));
      h.push_back(s.add_persistent(v.tensors[i].name, v.tensors[i].bytes, v.tensors[i].kind, init.back().data()));
    }
    try {
      (void)s.load(dir.path());
      ADD_FAILURE() << "loaded a checkpoint that should name " << v.named;
    } catch (const config_error& e) {
      EXPECT_TRUE(has(e.what(), v.named)) << e.what();
    }
    for (std::size_t i = 0; i < h.size(); ++i) {
      std::vector<unsigned char> back(v.tensors[i].bytes);
      s.read(h[i], back.data(), back.size());
      EXPECT_EQ(back, init[i]) << v.tensors[i].name << " changed although the load was refused";
    }
  }
}

// A loop that makes its optimizer state on first use (the moments added in the first step's
// update) resumes from its own checkpoint: load leaves that state in the file, add_persistent
// takes the value from there, and save is refused until it has (Note [State added after load]).
TEST(SessionCheckpoint, OptimizerStateAddedInTheFirstStepTakesItsValueFromTheCheckpoint) {
  test::temp_dir dir, again;
  const auto w0 = pattern(4_KiB, 0, 1), m_saved = pattern(8_KiB, 1, 2);
  auto lazy_step = [&](Session& s, tensor_handle w, std::optional<tensor_handle>& m, const std::vector<unsigned char>* init) {
    s.begin_iteration();
    if (!m) {
      const std::vector<unsigned char> zeros(8_KiB, 0);
      m = s.add_persistent("w.adam_m", 8_KiB, tensor_kind::optimizer_state, init ? init->data() : zeros.data());
    }
    { auto op = s.op("w.adam", {w, *m}, {w, *m}); }
    (void)s.end_iteration();
  };
  {
    Session s(cpu_config(0));
    auto w = s.add_persistent("w", 4_KiB, tensor_kind::parameter, w0.data());
    std::optional<tensor_handle> m;
    lazy_step(s, w, m, &m_saved);
    s.save(dir.path());
  }
  {
    Session s(cpu_config(0));
    auto w = s.add_persistent("w", 4_KiB, tensor_kind::parameter, pattern(4_KiB, 0, 9).data());
    (void)s.load(dir.path());  // was refused: "has tensor "w.adam_m" ... saved from another model"
    s.save(again.path());       // before the add: copies the waiting state from `dir`
    std::filesystem::remove_all(dir.path());  // it now waits in `again`
    std::optional<tensor_handle> m;
    lazy_step(s, w, m, nullptr);  // adds it with zeros: the checkpoint's value wins
    std::vector<unsigned char> got(8_KiB), gw(4_KiB);
    s.read(*m, got.data(), got.size());
    EXPECT_EQ(got, m_saved);
    s.read(w, gw.data(), gw.size());
    EXPECT_EQ(gw, w0);
  }
  {
    Session s(cpu_config(0));
    (void)s.add_persistent("w", 4_KiB, tensor_kind::parameter);
    (void)s.load(again.path());
    try {
      (void)s.add_persistent("w.adam_m", 4_KiB, tensor_kind::optimizer_state);
      ADD_FAILURE() << "took a checkpoint value of another size";
    } catch (const config_error& e) {
      EXPECT_TRUE(has(e.what(), "holds it as 8192 bytes of optimizer state")) << e.what();
    }
    auto m = s.add_persistent("w.adam_m", 8_KiB, tensor_kind::optimizer_state);  // the refused add left no trace
    std::vector<unsigned char> got(8_KiB);
    s.read(m, got.data(), got.size());
    EXPECT_EQ(got, m_saved);
  }
}

// The same for state a loop makes as one flat buffer split into views (saved as its pieces):
// each piece takes its value from the checkpoint when the views are laid out.
TEST(SessionCheckpoint, OptimizerStateSplitIntoViewsAddedAfterLoadTakesItsValues) {
  test::temp_dir dir;
  const auto m_saved = pattern(8_KiB, 3, 4);
  auto step = [](Session& s, tensor_handle a, tensor_handle b) {
    s.begin_iteration();
    { auto op = s.op("adam", {a, b}, {a, b}); }
    (void)s.end_iteration();
  };
  {
    Session s(cpu_config(0));
    auto m = s.add_persistent("m", 8_KiB, tensor_kind::optimizer_state, m_saved.data());
    step(s, s.add_view(m, 0, 4_KiB, "m.0"), s.add_view(m, 4_KiB, 4_KiB, "m.1"));
    s.save(dir.path());
  }
  Session s(cpu_config(0));
  (void)s.load(dir.path());
  auto m = s.add_persistent("m", 8_KiB, tensor_kind::optimizer_state);  // zeros, as a lazy loop makes it
  auto a = s.add_view(m, 0, 4_KiB, "m.0");
  auto b = s.add_view(m, 4_KiB, 4_KiB, "m.1");
  step(s, a, b);
  std::vector<unsigned char> got(8_KiB);
  s.read(m, got.data(), got.size());
  EXPECT_EQ(got, m_saved) << "the pieces started from zero";
}

TEST(SessionCheckpoint, FlippedByteIsACorruptionErrorNamingTheTensorAndChangesNothing) {
  test::temp_dir dir;
  {
    Session s(cpu_config(0));
    s.add_persistent("layer0.weight", 16_KiB, tensor_kind::parameter, pattern(16_KiB, 0, 1).data());
    s.add_persistent("layer1.weight", 16_KiB, tensor_kind::parameter, pattern(16_KiB, 1, 1).data());
    s.save(dir.path());
  }
  flip_byte(checkpoint_path(dir.path()), 64 + 16_KiB + 12345);  // inside layer1.weight, which is second
  Session s(cpu_config(0));
  const auto init0 = pattern(16_KiB, 0, 5), init1 = pattern(16_KiB, 1, 5);
  const auto a = s.add_persistent("layer0.weight", 16_KiB, tensor_kind::parameter, init0.data());
  const auto b = s.add_persistent("layer1.weight", 16_KiB, tensor_kind::parameter, init1.data());
  try {
    (void)s.load(dir.path());
    FAIL() << "a damaged checkpoint loaded";
  } catch (const corruption_error& e) {
    EXPECT_TRUE(has(e.what(), "\"layer1.weight\"") && has(e.what(), checkpoint_path(dir.path()))) << e.what();
  }
  std::vector<unsigned char> back(16_KiB);
  s.read(a, back.data(), back.size());
  EXPECT_EQ(back, init0) << "the tensor before the damaged one was loaded";
  s.read(b, back.data(), back.size());
  EXPECT_EQ(back, init1);
}

TEST(SessionCheckpoint, SaveAndLoadInsideAnIterationAreUsageErrors) {
  test::temp_dir dir;
  Session s(cpu_config(0));
  s.add_persistent("w", 4_KiB, tensor_kind::parameter);
  s.save(dir.path());
  s.begin_iteration();
  EXPECT_THROW(s.save(dir.path()), usage_error);
  EXPECT_THROW((void)s.load(dir.path()), usage_error);
  s.end_iteration();
  EXPECT_EQ(s.load(dir.path()), "");
}

// A persistent tensor whose first value found no room (the host tier full, no NVMe) is not
// registered: the name may be added again once there is room, and a checkpoint saved meanwhile
// holds the tensors there are, none of them zeros that stand for a lost value.
TEST(SessionCheckpoint, ATensorWhoseAddFoundNoRoomIsNotRegisteredNorSavedAsZeros) {
  test::temp_dir dir;
  auto cfg = cpu_config(0);
  cfg.host_budget = 8_KiB;
  Session s(cfg);
  std::vector<unsigned char> a(4_KiB, 1), w(16_KiB, 2);
  auto ta = s.add_persistent("a", a.size(), tensor_kind::parameter, a.data());
  EXPECT_THROW((void)s.add_persistent("w", w.size(), tensor_kind::parameter, w.data()), out_of_memory);
  s.save(dir.path());
  Session t(cpu_config(0));
  auto tb = t.add_persistent("a", a.size(), tensor_kind::parameter);
  EXPECT_NO_THROW((void)t.load(dir.path())) << "the checkpoint holds a tensor that was never added";
  std::vector<unsigned char> back(a.size());
  t.read(tb, back.data(), back.size());
  EXPECT_EQ(back, a);
  // The name is free for a tensor that fits.
  std::vector<unsigned char> small(2_KiB, 3);
  auto tw = s.add_persistent("w", small.size(), tensor_kind::parameter, small.data());
  std::vector<unsigned char> got(small.size());
  s.read(tw, got.data(), got.size());
  EXPECT_EQ(got, small);
  s.read(ta, back.data(), back.size());
  EXPECT_EQ(back, a);
}

// A gradient that the next iteration overwrites before reading may be dropped after its last use
// (its value is dead); a save still writes every tensor (Note [Checkpointed values]).
TEST(SessionCheckpoint, SavesWhenAGradientWasDroppedAfterItsLastUse) {
  test::temp_dir dir;
  constexpr std::uint64_t n = 16_KiB;  // floats
  Session s(cpu_config(3 * n * sizeof(float) + 4_KiB));
  const auto w0 = pattern(n * sizeof(float), 0, 1);
  const auto w = s.add_persistent("w", n * sizeof(float), tensor_kind::parameter, w0.data());
  const auto g = s.add_persistent("w.grad", n * sizeof(float), tensor_kind::gradient);
  const auto other = s.add_persistent("other", n * sizeof(float), tensor_kind::optimizer_state, w0.data());
  for (int it = 0; it < 3; ++it) {
    s.begin_iteration();
    auto act = s.add_transient("act", n * sizeof(float));
    {
      auto op = s.op("fwd", {w}, {act});
      auto *src = op.ptr<unsigned char>(w), *dst = op.ptr<unsigned char>(act);
      op.device().launch_kernel(op.stream(), [src, dst] { std::memcpy(dst, src, n * sizeof(float)); });
    }
    {
      auto op = s.op("bwd", {act}, {}, {g});
      auto *a = op.ptr<unsigned char>(act), *d = op.ptr<unsigned char>(g);
      op.device().launch_kernel(op.stream(), [a, d] {
        for (std::uint64_t i = 0; i < n * sizeof(float); ++i) d[i] = static_cast<unsigned char>(d[i] + (a[i] & 1));
      });
    }
    s.release(act);
    {
      auto op = s.op("other.step", {other}, {other});
      auto* p = op.ptr<unsigned char>(other);
      op.device().launch_kernel(op.stream(), [p] { p[0] = static_cast<unsigned char>(p[0] + 1); });
    }
    {
      auto op = s.op("adam.step", {w, g}, {w});
      auto *p = op.ptr<unsigned char>(w), *d = op.ptr<unsigned char>(g);
      op.device().launch_kernel(op.stream(), [p, d] {
        for (std::uint64_t i = 0; i < n * sizeof(float); ++i) p[i] = static_cast<unsigned char>(p[i] + d[i]);
      });
    }
    s.end_iteration();
  }
  std::vector<unsigned char> want(n * sizeof(float)), back(n * sizeof(float));
  s.read(w, want.data(), want.size());
  bool dropped = false;
  try {
    s.read(g, back.data(), back.size());
  } catch (const usage_error&) {
    dropped = true;
  }
  s.save(dir.path());
  Session fresh(cpu_config(0));
  const auto w2 = fresh.add_persistent("w", n * sizeof(float), tensor_kind::parameter);
  const auto g2 = fresh.add_persistent("w.grad", n * sizeof(float), tensor_kind::gradient);
  fresh.add_persistent("other", n * sizeof(float), tensor_kind::optimizer_state);
  (void)fresh.load(dir.path());
  fresh.read(w2, back.data(), back.size());
  EXPECT_EQ(back, want);
  fresh.read(g2, back.data(), back.size());
  if (dropped) {
    EXPECT_EQ(back, std::vector<unsigned char>(back.size(), 0)) << "a dropped gradient is saved as zeros";
  }
  RecordProperty("gradient_dropped", dropped ? "yes" : "no");
}

// Views: the checkpoint holds the bytes the executor keeps (a split parent's pieces); a Session
// that adds the same views loads them, and reads the parent whole; one without them is told so.
TEST(SessionCheckpoint, RoundTripOfAParentSplitIntoViews) {
  test::temp_dir dir;
  constexpr std::uint64_t layer = 8_KiB;
  const auto init = pattern(4 * layer + 100, 0, 1);
  auto build = [&](Session& s, const void* initial) {
    const auto p = s.add_persistent("params", init.size(), tensor_kind::parameter, initial);
    std::vector<tensor_handle> v;
    for (int l = 0; l < 4; ++l) v.push_back(s.add_view(p, l * layer, layer, "w" + std::to_string(l)));
    return std::make_pair(p, v);
  };
  std::vector<unsigned char> want(init.size()), back(init.size());
  {
    Session s(cpu_config(0));
    auto [p, v] = build(s, init.data());
    s.begin_iteration();
    for (int l = 0; l < 4; ++l) {
      auto op = s.op("step" + std::to_string(l), {v[l]}, {v[l]});
      auto* q = op.ptr<unsigned char>(v[l]);
      op.device().launch_kernel(op.stream(), [q, l] { q[5] = static_cast<unsigned char>(q[5] + l + 1); });
    }
    s.end_iteration();
    s.read(p, want.data(), want.size());
    s.save(dir.path());
  }
  EXPECT_NE(want, init);
  Session fresh(cpu_config(0));
  auto [p, v] = build(fresh, nullptr);
  (void)fresh.load(dir.path());
  fresh.read(p, back.data(), back.size());
  EXPECT_EQ(back, want);
  // A Session without the views is refused, and told why.
  Session plain(cpu_config(0));
  (void)plain.add_persistent("params", init.size(), tensor_kind::parameter);
  try {
    (void)plain.load(dir.path());
    ADD_FAILURE() << "a checkpoint of views loaded into a Session without them";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("same views"), std::string::npos) << e.what();
  }
}
