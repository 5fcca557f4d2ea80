// spillway-bench tiers: host tier D2H/H2D GB/s against memcpy of the same bytes, and NVMe tier
// write/read GB/s against fio (io_uring, O_DIRECT, same directory, block size and depth), one run.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "allocator/pinned_host_pool.hpp"
#include "bench/command.hpp"
#include "bench/outputs.hpp"
#include "offload/text_file.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#include "device/log.hpp"
#include "device/units.hpp"
#include "examples/common/flags.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_tier.hpp"

namespace spillway::bench {
namespace {

using clk = std::chrono::steady_clock;

struct tiers_args {
  examples::config_flags config;  // --config, --backend, --nvme-directories, --nvme-block-size, ...
  std::string size = "256MiB";
  int repeats = 3;
  std::string json;
  bool tune = false;
  bool no_huge_pages = false;
  std::string tune_out = "spillway-nvme-tuned.json";
};

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }
double gbps(std::size_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }

// ---- host tier ----------------------------------------------------------------------------

struct host_figures {
  double d2h = 0, h2d = 0, memcpy_d2h = 0, memcpy_h2d = 0;
};

// The host tier's moves are the executor's (tier_backing): a save copies device memory into a
// new host-tier block (D2H), a load copies the block back (H2D); each timed until the device
// has done the copy.
host_figures bench_host(Device& dev, std::size_t n, int repeats) {
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = n + (std::size_t{4} << 20), .alignment = 4096});
  host_tier host(pool, 0);
  tier_backing backing(dev, host, nullptr);
  constexpr tensor_id id = 0;
  owned_stream s(dev);
  void* d = dev.allocate(n);
  dev.memset_async(d, 0x5A, n, s);
  dev.synchronize_stream(s);
  // Baseline: memcpy of the same bytes between the same kinds of memory (warm pages). Device
  // memory of the cpu backend is host memory; CUDA device memory is not host-addressable, so
  // there the baseline copies between two pinned buffers.
  const bool cpu = dev.properties().backend == backend::cpu;
  void* a = pool.allocate(n);
  void* b = cpu ? d : pool.allocate(n);
  std::memset(a, 1, n);
  if (!cpu) std::memset(b, 2, n);
  // Each round times the tier's move and then memcpy the same way, so a load that comes and
  // goes on a shared machine falls on both; the first round warms the pages and is not counted.
  double best_d2h = 1e30, best_h2d = 1e30, m_d2h = 1e30, m_h2d = 1e30;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = clk::now();
    backing.save(id, "bench", d, n, tier::host, s).wait();
    const double t_d2h = seconds_since(t0);
    t0 = clk::now();
    std::memcpy(a, b, n);
    const double c_d2h = seconds_since(t0);
    t0 = clk::now();
    backing.load(id, "bench", d, n, s).wait();
    const double t_h2d = seconds_since(t0);
    t0 = clk::now();
    std::memcpy(b, a, n);
    const double c_h2d = seconds_since(t0);
    if (r > 0) {
      best_d2h = std::min(best_d2h, t_d2h);
      best_h2d = std::min(best_h2d, t_h2d);
      m_d2h = std::min(m_d2h, c_d2h);
      m_h2d = std::min(m_h2d, c_h2d);
    }
    // The next save makes a new host-tier block, as the first did (a load keeps the tier copy).
    backing.discard(id);
  }
  host_figures f;
  f.d2h = gbps(n, best_d2h);
  f.h2d = gbps(n, best_h2d);
  f.memcpy_d2h = gbps(n, m_d2h);
  f.memcpy_h2d = gbps(n, m_h2d);
  pool.deallocate(a, n);
  if (!cpu) pool.deallocate(b, n);
  backing.drain();
  dev.deallocate(d, n);
  return f;
}

// ---- NVMe tier ----------------------------------------------------------------------------

struct nvme_figures {
  double write = 0, read = 0;
  bool direct = true;
  std::uint64_t fixed_ops = 0, ops = 0;
  std::uint64_t huge_page_bytes = 0;
};

nvme_figures bench_nvme(Device& dev, const std::vector<std::string>& dirs, std::size_t n, std::uint32_t bs,
                        unsigned depth, unsigned rings, int repeats, bool huge_pages) {
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = std::min<std::size_t>(n, std::size_t{1} << 30),
                              .alignment = 4096});
  nvme_options o;
  o.directories = dirs;
  o.reserve = n + static_cast<std::uint64_t>(bs) * dirs.size();
  o.block_size = bs;
  o.queue_depth = depth;
  o.rings = rings;
  o.huge_pages = huge_pages;
  // The buffer first: the tier registers the pool's regions when it is made, outside the
  // timed moves, as fio registers its buffers before its clock starts.
  auto* buf = static_cast<unsigned char*>(pool.allocate(n));
  nvme_tier tier(o, &pool);
  for (std::size_t i = 0; i < n; i += 4096) buf[i] = static_cast<unsigned char>(i >> 12);
  nvme_figures f;
  f.direct = tier.direct_io();
  double best_w = 1e30, best_r = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = clk::now();
    tier.write("bench", buf, n, n).wait();
    best_w = std::min(best_w, seconds_since(t0));
    t0 = clk::now();
    tier.read("bench", buf, n).wait();
    best_r = std::min(best_r, seconds_since(t0));
    tier.erase("bench");
  }
  f.write = gbps(n, best_w);
  f.read = gbps(n, best_r);
  f.ops = tier.stats().ops;
  f.fixed_ops = tier.stats().fixed_buffer_ops;
  f.huge_page_bytes = tier.stats().huge_page_bytes;
  pool.deallocate(buf, n);
  return f;
}

// ---- fio ----------------------------------------------------------------------------------

// Runs argv, returns its stdout, or nullopt when it cannot be run or exits non-zero.
std::optional<std::string> capture(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    ::dup2(fds[1], 1);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[65536];
  for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(k));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

struct fio_figures {
  double write = 0, read = 0;
  bool ran = false;
  std::string command;
  std::string memory_note;  ///< how fio's buffers were backed, when not by huge pages as asked
};

// fio's buffers on huge pages, as the tier's registered buffers are (Device::allocate_pinned asks
// for them): a file on a mounted hugetlbfs (--iomem=mmaphuge:FILE) when there is one, else SysV
// shared memory on huge pages (--iomem=shmhuge), in both cases only when /proc/meminfo shows
// enough free huge pages for `need` bytes. Empty (fio's own memory) otherwise, with `note` saying
// why, so the comparison says what it compared.
std::string fio_huge_memory(std::size_t need, std::string& note) {
  std::uint64_t free_pages = 0, page_kib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    std::uint64_t v = 0;
    meminfo >> v;
    if (key == "HugePages_Free:") free_pages = v;
    if (key == "Hugepagesize:") page_kib = v;
    meminfo.ignore(256, '\n');
  }
  const std::uint64_t free_bytes = free_pages * page_kib * 1024;
  if (free_bytes < need) {
    std::string thp;  // e.g. "always [madvise] never": fio's own memory gets THP only under [always]
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
    note = "fio's buffers are in ordinary memory: " + std::to_string(free_pages) + " huge pages free (" +
           format_bytes(free_bytes) + "), " + format_bytes(need) + " needed for --iomem=mmaphuge/shmhuge" +
           (thp.empty() ? "" : "; transparent huge pages: " + thp);
    return {};
  }
  std::ifstream mounts("/proc/mounts");
  for (std::string dev, dir, type, rest; mounts >> dev >> dir >> type && std::getline(mounts, rest);)
    if (type == "hugetlbfs" && ::access(dir.c_str(), W_OK) == 0) return "--iomem=mmaphuge:" + dir + "/spillway-fio.huge";
  return "--iomem=shmhuge";
}

// fio with the tier's settings: io_uring, O_DIRECT, registered buffers, same block size and
// depth, one job per directory, a write pass then a read pass of the same file(s).
fio_figures run_fio(const std::vector<std::string>& dirs, std::size_t n, std::uint32_t bs, unsigned depth, int repeats) {
  fio_figures f;
  std::string dir_list;
  for (const auto& d : dirs) dir_list += (dir_list.empty() ? "" : ":") + d;
  const auto per_job = n / dirs.size() / bs * bs;
  std::vector<std::string> common{"fio", "--output-format=json", "--ioengine=io_uring", "--direct=1",
                                  "--fixedbufs=1", "--bs=" + std::to_string(bs), "--iodepth=" + std::to_string(depth),
                                  "--size=" + std::to_string(std::max<std::size_t>(per_job, bs)),
                                  "--numjobs=" + std::to_string(dirs.size()), "--group_reporting=1",
                                  "--directory=" + dir_list, "--filename_format=spillway-fio.$jobnum"};
  // fio keeps bs * iodepth bytes of buffers per job; a little more for alignment.
  std::string iomem = fio_huge_memory(dirs.size() * (std::size_t{bs} * depth + (2u << 20)), f.memory_note);
  if (!iomem.empty()) common.push_back(iomem);
  auto run_pass = [&](const std::string& rw) -> double {
    auto argv = common;
    argv.push_back("--name=" + rw);
    argv.push_back("--rw=" + rw);
    if (f.command.empty() || rw == "write") {
      f.command.clear();
      for (const auto& a : argv) f.command += (f.command.empty() ? "" : " ") + a;
    }
    const auto out = capture(argv);
    if (!out) return -1;
    try {
      const auto j = nlohmann::json::parse(out->substr(out->find('{')));
      return j.at("jobs").at(0).at(rw).at("bw_bytes").get<double>() / 1e9;
    } catch (const std::exception&) {
      return -1;
    }
  };
  double w = 0, r = 0;
  bool ok = true;
  if (!iomem.empty() && run_pass("write") < 0) {  // huge pages refused after all: fio's own memory
    std::erase(common, iomem);
    f.command.clear();
    f.memory_note = "fio refused huge-page buffers (" + iomem + "); its buffers are in ordinary memory";
    iomem.clear();
  }
  for (int k = 0; k < repeats && ok; ++k) {
    const double wk = run_pass("write");
    const double rk = run_pass("read");
    ok = wk >= 0 && rk >= 0;
    w = std::max(w, wk);
    r = std::max(r, rk);
  }
  for (std::size_t j = 0; j < dirs.size(); ++j) {
    std::error_code ec;
    std::filesystem::remove(dirs[j] + "/spillway-fio." + std::to_string(j), ec);
  }
  if (const std::string huge = "--iomem=mmaphuge:"; iomem.starts_with(huge)) {
    std::error_code ec;
    std::filesystem::remove(iomem.substr(huge.size()), ec);
  }
  f.ran = ok;
  f.write = w;
  f.read = r;
  return f;
}

// ---- the command --------------------------------------------------------------------------

std::string target_line(const char* what, double got, double baseline, double ratio, bool& missed) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2);
  if (baseline <= 0) {
    s << "  SKIP  " << what << ": no baseline";
    return s.str();
  }
  const bool pass = got >= ratio * baseline;
  missed = missed || !pass;
  s << "  " << (pass ? "PASS" : "MISS") << "  " << what << ": " << got << " GB/s vs " << baseline << " GB/s ("
    << got / baseline << "x, target >= " << ratio << "x)";
  return s.str();
}

// Whether `text` is a snippet that --tune writes: a JSON object holding only "nvme", with no
// settings in it but the four the sweep sets.
bool is_tune_snippet(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.size() != 1 || !j.contains("nvme") || !j["nvme"].is_object()) return false;
  for (const auto& [key, value] : j["nvme"].items())
    if (key != "directories" && key != "block_size" && key != "queue_depth" && key != "rings") return false;
  return true;
}

// Where --tune writes, checked before any work. The snippet replaces a file only when that file
// is empty or is itself a snippet of an earlier --tune (running the sweep again updates its
// result): any other file at that path, given with --tune-out or found in the current folder
// under the default name, may be a config the user wrote, with settings the snippet would lose,
// so it is refused and the user asked for another path. The same holds for --config: its file
// is an input and is never replaced.
void check_tune_out(const tiers_args& a, bool tune_out_given) {
  if (!a.tune) {
    if (tune_out_given) throw config_error("--tune-out: only --tune writes a snippet; give --tune too, or leave --tune-out out");
    check_outputs({{"--json", a.json}}, {{"--config", a.config.config_file}});
    return;
  }
  check_writable(a.tune_out, "--tune-out");
  check_outputs({{"--json", a.json}, {"--tune-out", a.tune_out}}, {{"--config", a.config.config_file}});
  struct stat st {};
  if (::stat(a.tune_out.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
  if (!is_tune_snippet(offload::read_text_file(a.tune_out, "the --tune-out file", "a snippet of --tune")))
    throw config_error("--tune-out: '" + a.tune_out + "' exists and is not a snippet of --tune (a JSON object with only " +
                       "\"nvme\" and its directories, block_size, queue_depth and rings); the snippet would replace what it holds: " +
                       "give --tune-out a new file, or move that one away");
}

int run(const tiers_args& a) {
  const std::size_t n = parse_size(a.size, "--size");
  session_config c = examples::load_config(a.config);
  if (c.nvme.directories.empty()) c.nvme.directories = {"/tmp"};
  c.validate();
  const auto& dirs = c.nvme.directories;
  const auto bs = static_cast<std::uint32_t>(c.nvme.block_size);
  const auto rings = static_cast<unsigned>(c.nvme.rings);
  std::string dir_text;
  for (const auto& d : dirs) dir_text += (dir_text.empty() ? "" : ",") + d;
  set_log_sink([](log_level l, const std::string& m) { std::cerr << "[" << to_string(l) << "] " << m << "\n"; });

  device_options o;
  o.pinned_huge_pages = !a.no_huge_pages;
  o.cpu_device_memory = c.cpu_device_memory != 0 ? c.cpu_device_memory : n + (std::size_t{64} << 20);
  o.strict.callback_seed = c.cpu_callback_seed;
  auto dev = make_device(c.backend, o);
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "device: " << dev->properties().name << "\n"
            << "size " << format_bytes(n) << ", swap directories " << dir_text << ", best of " << a.repeats << "\n";

  const auto host = bench_host(*dev, n, a.repeats);
  std::cout << "host tier  D2H " << host.d2h << " GB/s (memcpy " << host.memcpy_d2h << "),  H2D " << host.h2d
            << " GB/s (memcpy " << host.memcpy_h2d << ")\n";

  std::uint32_t best_bs = bs;
  unsigned best_depth = static_cast<unsigned>(c.nvme.queue_depth);
  nlohmann::json sweep = nlohmann::json::array();
  if (a.tune) {
    std::cout << "tuning the NVMe tier (block size x queue depth):\n";
    double best = -1;
    for (std::uint32_t b : {256u << 10, 512u << 10, 1u << 20, 2u << 20, 4u << 20}) {
      for (unsigned d : {4u, 8u, 16u, 32u, 64u}) {
        const auto f = bench_nvme(*dev, dirs, n, b, d, rings, 1, !a.no_huge_pages);
        const double score = std::min(f.write, f.read);
        std::cout << "  block " << std::setw(10) << format_bytes(b) << "  depth " << std::setw(3) << d << "  write "
                  << f.write << " GB/s  read " << f.read << " GB/s\n";
        sweep.push_back({{"block_size", b}, {"queue_depth", d}, {"write_gbps", f.write}, {"read_gbps", f.read}});
        if (score > best) {
          best = score;
          best_bs = b;
          best_depth = d;
        }
      }
    }
    std::cout << "best: block " << format_bytes(best_bs) << ", depth " << best_depth << "\n";
    // A session config file: --config FILE (or session_config::from_json_file) takes it as is.
    nlohmann::json snippet = {{"nvme",
                               {{"directories", dirs},
                                {"block_size", best_bs},
                                {"queue_depth", best_depth},
                                {"rings", rings}}}};
    write_output(a.tune_out, snippet.dump(2) + "\n", "--tune-out");
    std::cout << "wrote " << a.tune_out << "\n";
  }

  // Ours and fio take turns, best of each: a shared drive's speed drifts over seconds, and
  // turns keep that drift from favouring whichever runs second.
  nvme_figures nv;
  fio_figures fio;
  for (int r = 0; r < a.repeats; ++r) {
    const auto ours = bench_nvme(*dev, dirs, n, best_bs, best_depth, rings, 1, !a.no_huge_pages);
    nv.write = std::max(nv.write, ours.write);
    nv.read = std::max(nv.read, ours.read);
    nv.direct = ours.direct;
    nv.ops += ours.ops;
    nv.fixed_ops += ours.fixed_ops;
    nv.huge_page_bytes = ours.huge_page_bytes;
    const auto theirs = run_fio(dirs, n, best_bs, best_depth, 1);
    fio.ran = theirs.ran;
    fio.command = theirs.command;
    fio.memory_note = theirs.memory_note;
    fio.write = std::max(fio.write, theirs.write);
    fio.read = std::max(fio.read, theirs.read);
    if (!theirs.ran) break;
  }
  std::cout << "nvme tier  write " << nv.write << " GB/s, read " << nv.read << " GB/s (block " << format_bytes(best_bs)
            << ", depth " << best_depth << ", rings " << rings << (nv.direct ? ", O_DIRECT" : ", buffered")
            << ", " << nv.fixed_ops << "/" << nv.ops << " ops on fixed buffers, " << format_bytes(nv.huge_page_bytes)
            << " of registered buffers on huge pages)\n";
  if (fio.ran)
    std::cout << "fio        write " << fio.write << " GB/s, read " << fio.read << " GB/s\n  (" << fio.command << ")\n"
              << (fio.memory_note.empty() ? "" : "  note: " + fio.memory_note + "\n");
  else
    std::cout << "fio        could not run (is fio installed?): no NVMe baseline\n";

  bool missed = false;
  const double host_copy = std::min(host.d2h, host.h2d);
  const double memcpy_gbps = std::min(host.memcpy_d2h, host.memcpy_h2d);
  std::cout << "targets:\n"
            << target_line("host tier D2H vs memcpy", host.d2h, host.memcpy_d2h, 0.9, missed) << "\n"
            << target_line("host tier H2D vs memcpy", host.h2d, host.memcpy_h2d, 0.9, missed) << "\n"
            << target_line("nvme write vs fio", nv.write, fio.ran ? fio.write : 0, 0.9, missed) << "\n"
            << target_line("nvme read vs fio", nv.read, fio.ran ? fio.read : 0, 0.9, missed) << "\n";
  if (!a.json.empty()) {
    nlohmann::json j = {{"device", dev->properties().name},
                        {"bytes", n},
                        {"directories", dirs},
                        {"host_d2h_gbps", host.d2h},
                        {"host_h2d_gbps", host.h2d},
                        {"host_copy_gbps", host_copy},
                        {"memcpy_d2h_gbps", host.memcpy_d2h},
                        {"memcpy_h2d_gbps", host.memcpy_h2d},
                        {"memcpy_gbps", memcpy_gbps},
                        {"nvme_write_gbps", nv.write},
                        {"nvme_read_gbps", nv.read},
                        {"nvme_direct_io", nv.direct},
                        {"nvme_huge_page_bytes", nv.huge_page_bytes},
                        {"fio_write_gbps", fio.write},
                        {"fio_read_gbps", fio.read},
                        {"fio_ran", fio.ran},
                        {"fio_command", fio.command},
                        {"block_size", best_bs},
                        {"queue_depth", best_depth},
                        {"rings", rings},
                        {"targets_met", !missed}};
    if (a.tune) j["sweep"] = sweep;
    write_output(a.json, j.dump(2) + "\n", "--json");
  }
  return missed ? 1 : 0;
}

const command_registration registration{"tiers", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<tiers_args>();
  auto* cmd = app.add_subcommand("tiers", "host tier vs memcpy and NVMe tier vs fio, GB/s");
  examples::add_config_flags(*cmd, args->config,
                             {"backend", "cpu_device_memory", "cpu_callback_seed", "nvme.directories", "nvme.block_size",
                              "nvme.queue_depth", "nvme.rings"});
  cmd->add_option("--size", args->size, "bytes moved per measurement")->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "measurements per figure (best taken)")->capture_default_str()->check(whole_number_in(1, 1000));
  cmd->add_option("--json", args->json, "write the figures as JSON")->check(writable_file);
  cmd->add_flag("--no-huge-pages", args->no_huge_pages, "pinned buffers on 4 KiB pages (device_options::pinned_huge_pages off)");
  cmd->add_flag("--tune", args->tune, "sweep block size and queue depth; write the best as a config snippet");
  auto* tune_out = cmd->add_option("--tune-out", args->tune_out,
                                   "where --tune writes its snippet (replaces only an earlier snippet of --tune)")
                       ->check(writable_file)
                       ->capture_default_str();
  cmd->callback([args, tune_out, &exit_code] {
    check_tune_out(*args, tune_out->count() > 0);
    exit_code = run(*args);
  });
}};

}  // namespace
}  // namespace spillway::bench
