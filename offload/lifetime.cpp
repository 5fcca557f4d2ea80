// Lifetime analyzer: one pass collects uses, a difference array turns them into per-op bytes.
// See Note [Live and needed bytes] in lifetime.hpp.
#include "offload/lifetime.hpp"

#include <algorithm>
#include <sstream>
#include <nlohmann/json.hpp>

#include "device/units.hpp"

namespace spillway::offload {

namespace {
// Adds `bytes` to ops [from, to] (inclusive) of a difference array of size n + 1.
void add_range(std::vector<std::int64_t>& diff, std::size_t from, std::size_t to, std::uint64_t bytes) {
  if (from > to) return;
  diff[from] += static_cast<std::int64_t>(bytes);
  diff[to + 1] -= static_cast<std::int64_t>(bytes);
}

std::vector<std::uint64_t> integrate(const std::vector<std::int64_t>& diff, std::size_t n) {
  std::vector<std::uint64_t> out(n);
  std::int64_t acc = 0;
  for (std::size_t i = 0; i < n; ++i) {
    acc += diff[i];
    out[i] = static_cast<std::uint64_t>(acc);
  }
  return out;
}
}  // namespace

lifetime_report analyze(const trace& t) {
  t.validate();
  const std::size_t n = t.ops.size();
  lifetime_report r;
  r.tensors.resize(t.tensors.size());
  for (op_index i = 0; i < n; ++i) {
    const auto& op = t.ops[i];
    r.total_flops += op.flops;
    for (tensor_id x : op.reads) r.tensors[x].uses.push_back({i, true, false});
    for (tensor_id x : op.writes) {
      auto& u = r.tensors[x].uses;
      if (!u.empty() && u.back().op == i)
        u.back().writes = true;
      else
        u.push_back({i, false, true});
      r.tensors[x].written = true;
    }
  }
  std::vector<std::int64_t> live(n + 1, 0), live_after(n + 1, 0), needed(n + 1, 0), needed_w(n + 1, 0), idle(n + 1, 0);
  for (std::size_t x = 0; x < t.tensors.size(); ++x) {
    auto& lt = r.tensors[x];
    const auto& d = t.tensors[x];
    r.bytes_by_kind[static_cast<int>(d.kind)] += d.bytes;
    const bool persistent = is_persistent(d.kind);
    if (persistent) r.persistent_bytes += d.bytes;
    if (n == 0) continue;
    if (persistent) {
      add_range(live, 0, n - 1, d.bytes);
      add_range(live_after, 0, n - 1, d.bytes);
    }
    if (!lt.used()) continue;
    if (!persistent) {
      add_range(live, lt.first_use(), lt.last_use(), d.bytes);
      if (lt.last_use() > lt.first_use()) add_range(live_after, lt.first_use(), lt.last_use() - 1, d.bytes);
    }
    auto mark_needed = [&](std::size_t from, std::size_t to) {
      add_range(needed, from, to, d.bytes);
      if (lt.written) add_range(needed_w, from, to, d.bytes);
    };
    bool written_so_far = false;
    for (std::size_t k = 0; k < lt.uses.size(); ++k) {
      mark_needed(lt.uses[k].op, lt.uses[k].op);
      written_so_far = written_so_far || lt.uses[k].writes;
      if (k + 1 < lt.uses.size()) {
        const auto& a = lt.uses[k];
        const auto& b = lt.uses[k + 1];
        if (b.op > a.op + 1) {
          lt.gaps.push_back({a.op, b.op, b.op - a.op - 1, false, b.reads});
          if (b.reads) mark_needed(a.op + 1, b.op - 1);
          if (b.reads && written_so_far) add_range(idle, a.op + 1, b.op - 1, d.bytes);
        }
      }
    }
    if (persistent) {
      const auto& first = lt.uses.front();
      lt.crosses_boundary = first.reads;
      const std::uint32_t inside = static_cast<std::uint32_t>(n - 1 - lt.last_use() + first.op);
      if (inside > 0) lt.gaps.push_back({lt.last_use(), first.op, inside, true, first.reads});
      if (first.reads) {
        if (lt.last_use() + 1 <= n - 1) mark_needed(lt.last_use() + 1, n - 1);
        if (first.op > 0) mark_needed(0, first.op - 1);
      }
    }
  }
  r.live_bytes_during = integrate(live, n);
  r.live_bytes_after = integrate(live_after, n);
  r.needed_bytes_during = integrate(needed, n);
  r.needed_written_bytes_during = integrate(needed_w, n);
  r.in_iteration_idle_bytes = integrate(idle, n);
  r.working_set_bytes.resize(n);
  for (op_index i = 0; i < n; ++i) {
    r.working_set_bytes[i] = t.working_set_bytes(i);
    if (r.live_bytes_during[i] > r.peak_live_bytes) {
      r.peak_live_bytes = r.live_bytes_during[i];
      r.peak_op = i;
    }
    if (r.working_set_bytes[i] > r.min_budget_bytes) {
      r.min_budget_bytes = r.working_set_bytes[i];
      r.min_budget_op = i;
    }
  }
  return r;
}

std::string format_report(const lifetime_report& r, const trace& t) {
  std::ostringstream os;
  os << "trace: " << t.ops.size() << " ops, " << t.tensors.size() << " tensors, "
     << r.total_flops / 1e12 << " TFLOP\n";
  for (int k = 0; k < tensor_kind_count; ++k)
    os << "  " << to_string(static_cast<tensor_kind>(k)) << ": " << format_bytes(r.bytes_by_kind[k]) << "\n";
  if (!t.ops.empty()) {
    os << "peak live: " << format_bytes(r.peak_live_bytes) << " during op " << r.peak_op << " ('"
       << t.ops[r.peak_op].name << "')\n";
    os << "least budget any plan needs: " << format_bytes(r.min_budget_bytes) << " (working set of op "
       << r.min_budget_op << " '" << t.ops[r.min_budget_op].name << "')\n";
  }
  std::vector<std::size_t> order(t.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return t.tensors[a].bytes > t.tensors[b].bytes; });
  os << "largest tensors (first use, last use, idle gaps in ops):\n";
  for (std::size_t k = 0; k < std::min<std::size_t>(order.size(), 10); ++k) {
    const auto x = order[k];
    const auto& lt = r.tensors[x];
    os << "  " << t.tensors[x].name << " [" << to_string(t.tensors[x].kind) << "] "
       << format_bytes(t.tensors[x].bytes);
    if (lt.used()) {
      os << " uses " << lt.first_use() << ".." << lt.last_use() << " gaps";
      for (const auto& g : lt.gaps) os << " " << g.ops << (g.wraps ? "(wrap)" : "");
    } else {
      os << " unused";
    }
    os << "\n";
  }
  return os.str();
}

nlohmann::json report_to_json(const lifetime_report& r, const trace& t) {
  nlohmann::json j;
  j["ops"] = t.ops.size();
  j["peak_live_bytes"] = r.peak_live_bytes;
  j["peak_op"] = r.peak_op;
  j["min_budget_bytes"] = r.min_budget_bytes;
  j["min_budget_op"] = r.min_budget_op;
  j["persistent_bytes"] = r.persistent_bytes;
  j["total_flops"] = r.total_flops;
  j["live_bytes_during"] = r.live_bytes_during;
  j["live_bytes_after"] = r.live_bytes_after;
  j["needed_bytes_during"] = r.needed_bytes_during;
  auto& ts = j["tensors"] = nlohmann::json::array();
  for (std::size_t x = 0; x < t.tensors.size(); ++x) {
    const auto& lt = r.tensors[x];
    nlohmann::json e{{"name", t.tensors[x].name}, {"bytes", t.tensors[x].bytes},
                     {"kind", to_string(t.tensors[x].kind)}};
    if (lt.used()) {
      e["first_use"] = lt.first_use();
      e["last_use"] = lt.last_use();
    }
    auto& gs = e["gaps"] = nlohmann::json::array();
    for (const auto& g : lt.gaps)
      gs.push_back({{"after", g.after}, {"before", g.before}, {"ops", g.ops}, {"wraps", g.wraps},
                    {"contents_needed", g.contents_needed}});
    ts.push_back(std::move(e));
  }
  return j;
}

}  // namespace spillway::offload
