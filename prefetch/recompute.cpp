// The plan's drops that await a recomputation (Note [Drops for recomputation] in recompute.hpp).
#include "prefetch/recompute.hpp"

#include <algorithm>
#include <limits>

namespace spillway {

namespace {
// Fills start and items with `keys` lists from the calls each(add) makes, add(key, value) in
// ascending value order per key; a value equal to its key's last is not added again. each runs
// twice: once to count, once to fill.
template <class Each>
void build(std::size_t keys, Each each, std::vector<std::uint32_t>& start, std::vector<op_index>& items) {
  constexpr auto none = std::numeric_limits<op_index>::max();
  std::vector<op_index> last(keys, none);
  std::vector<std::uint32_t> count(keys + 1, 0);
  each([&](std::size_t key, op_index v) {
    if (key >= keys || last[key] == v) return;
    last[key] = v;
    ++count[key + 1];
  });
  for (std::size_t i = 0; i < keys; ++i) count[i + 1] += count[i];
  start = count;
  items.assign(count[keys], 0);
  std::fill(last.begin(), last.end(), none);
  each([&](std::size_t key, op_index v) {
    if (key >= keys || last[key] == v) return;
    last[key] = v;
    items[count[key]++] = v;
  });
}
}  // namespace

rerun_index::rerun_index(const trace& t, const plan& p) : t_(&t) {
  const std::size_t nt = t.tensors.size(), n = t.ops.size();
  build(nt, [&](auto add) {
    for (op_index k = 0; k < n; ++k)
      for (auto x : t.ops[k].writes) add(x, k);
  }, writes_.start, writes_.items);
  build(nt, [&](auto add) {
    for (op_index k = 0; k < n; ++k)
      for (auto x : t.ops[k].reads) add(x, k);
  }, reads_.start, reads_.items);
  build(n, [&](auto add) {
    for (op_index k = 0; k < p.steps.size(); ++k)
      for (auto o : p.steps[k].recomputes) add(o, k);
  }, reruns_.start, reruns_.items);
  build(nt, [&](auto add) {
    for (op_index k = 0; k < p.steps.size(); ++k)
      for (auto o : p.steps[k].recomputes)
        if (o < n)
          for (auto x : t.ops[o].reads) add(x, k);
  }, rerun_reads_.start, rerun_reads_.items);
}

op_index rerun_index::next_rerun_read(tensor_id x, op_index k) const {
  constexpr auto none = std::numeric_limits<op_index>::max();
  if (t_ == nullptr || x >= rerun_reads_.size()) return none;
  const auto r = rerun_reads_[x];
  auto next = std::upper_bound(r.begin(), r.end(), k);
  if (next == r.end()) return none;
  const op_index w = writer_before(x, *next);
  if (w < reruns_.size()) {
    const auto at = reruns_[w];
    auto rerun = std::upper_bound(at.begin(), at.end(), k);
    if (rerun != at.end() && *rerun <= *next) return none;  // made again before that read
  }
  return *next;
}

bool rerun_index::freed_before_op(tensor_id x, op_index k) const {
  if (t_ == nullptr || x >= t_->tensors.size() || is_persistent(t_->tensors[x].kind)) return false;
  const auto r = reads_[x];
  if (std::lower_bound(r.begin(), r.end(), k) != r.end()) return false;  // op k or a later op reads it
  const auto w = writes_[x];
  if (std::binary_search(w.begin(), w.end(), k)) return false;
  return next_rerun_read(x, k) == std::numeric_limits<op_index>::max();
}

op_index rerun_index::writer_before(tensor_id x, op_index k) const {
  constexpr auto none = std::numeric_limits<op_index>::max();
  if (t_ == nullptr || x >= writes_.size()) return none;
  const auto w = writes_[x];
  auto it = std::upper_bound(w.begin(), w.end(), k);
  return it == w.begin() ? none : *std::prev(it);
}

bool rerun_index::drop_awaits_rerun(tensor_id x, op_index k) const {
  if (t_ == nullptr || x >= t_->tensors.size() || is_persistent(t_->tensors[x].kind)) return false;
  const op_index w = writer_before(x, k);
  if (w >= t_->ops.size() || !t_->ops[w].recomputable) return false;
  const auto r = reads_[x];
  auto next_read = std::upper_bound(r.begin(), r.end(), k);
  if (next_read == r.end()) return false;  // nothing reads it again: the usual rule applies
  const auto at = reruns_[w];
  auto rerun = std::upper_bound(at.begin(), at.end(), k);
  return rerun != at.end() && *rerun <= *next_read;
}

}  // namespace spillway
