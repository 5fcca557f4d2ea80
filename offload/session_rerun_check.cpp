// Session's check that a recomputable op's reruns write what its first run wrote (Note
// [Checking reruns]).
#include <cstdio>
#include <vector>

#include "offload/session_impl.hpp"
#include "swap/crc32c.hpp"

namespace spillway {

// Note [Checking reruns]
// A recomputable op promises that what it writes depends only on what it reads, the same way at
// every run (Note [Recomputation] in prefetch/plan.hpp). Plans that drop its outputs rely on it,
// and a body that breaks it trains on other numbers than the loop without Spillway, silently: a
// dropout mask drawn from a generator that has moved on since the first run, a value captured
// from the loop that changed, a sum whose order varies from run to run (atomics). With
// check_reruns the Session checks the promise where the plan uses it. At begin_iteration it
// notes which ops the followed plan reruns; after the first run of such an op it reads back each
// value the op wrote and keeps its CRC32C; after each rerun it reads them again and compares. A
// difference is a usage_error naming the op, the value and both checksums, raised from the op
// the rerun ran before. Workspaces are left out: no later op reads what a workspace holds after
// its op, so a rerun may leave other bits there. Each read waits for the compute stream, so the
// check costs those ops their overlap with the copies: a debug setting, off by default. An
// iteration that records (no plan yet) reruns nothing and checks nothing; the reruns of one that
// departs from its plan (Note [Recomputable ops]) are checked as the plan's are.

namespace {

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The CRC32C of each value op `k` wrote (its pieces where it names a parent split into views),
// read back from the device on the compute stream; workspaces left out.
std::vector<std::pair<tensor_id, std::uint32_t>> written_checksums(session_impl& s, op_index k) {
  std::vector<std::pair<tensor_id, std::uint32_t>> out;
  std::vector<std::byte> host;
  const stream cs = s.exec->compute_stream();
  for (const tensor_id w : s.ops.at(k).writes)
    for (const tensor_id id : s.pieces_of(w)) {
      const auto& d = s.tensors.at(id);
      if (d.kind == tensor_kind::workspace) continue;
      host.resize(d.bytes);
      s.dev->copy_async(host.data(), s.exec->device_ptr(id), d.bytes, copy_kind::device_to_host, cs);
      s.dev->synchronize_stream(cs);
      out.emplace_back(id, crc32c(host.data(), host.size()));
    }
  return out;
}

}  // namespace

void session_impl::plan_rerun_checks() {
  reruns_planned.clear();
  first_runs.clear();
  if (!cfg.check_reruns || !following) return;
  reruns_planned.assign(active->p.steps.size(), 0);
  for (const auto& step : active->p.steps)
    for (const op_index o : step.recomputes)
      if (o < reruns_planned.size()) reruns_planned[o] = 1;
}

void session_impl::note_first_run(op_index k) {
  if (k >= reruns_planned.size() || reruns_planned[k] == 0) return;
  first_runs[k] = written_checksums(*this, k);
}

void session_impl::check_rerun(op_index o) {
  const auto first = first_runs.find(o);
  if (first == first_runs.end()) return;
  const auto again = written_checksums(*this, o);
  for (std::size_t i = 0; i < again.size() && i < first->second.size(); ++i) {
    if (again[i] == first->second[i]) continue;
    throw usage_error("check_reruns: the rerun of op " + std::to_string(o) + " \"" + ops.at(o).name +
                      "\" wrote other bits to \"" + tensors.at(again[i].first).name + "\" than its first run in this " +
                      "iteration (CRC32C " + hex(first->second[i].second) + ", then " + hex(again[i].second) +
                      "). A recomputable op must write what its reads alone decide, the same way at every run: look "
                      "for state its body keeps between runs (a random generator, a counter, a value captured from "
                      "the loop) or work whose order varies (atomic sums). Draw random numbers from a generator "
                      "seeded with op.seed() (the same at every run of the op), fix the body, or give the op with "
                      "op() so that no plan runs it again");
  }
}

}  // namespace spillway
