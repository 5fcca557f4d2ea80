// The plan's drops that await a recomputation (Note [Drops for recomputation] in recompute.hpp).
#include "prefetch/recompute.hpp"

#include <algorithm>
#include <limits>

namespace spillway {

rerun_index::rerun_index(const trace& t, const plan& p)
    : t_(&t), writes_(t.tensors.size()), reads_(t.tensors.size()), reruns_(t.ops.size()), rerun_reads_(t.tensors.size()) {
  for (op_index k = 0; k < t.ops.size(); ++k) {
    for (auto x : t.ops[k].writes)
      if (x < writes_.size()) writes_[x].push_back(k);
    for (auto x : t.ops[k].reads)
      if (x < reads_.size()) reads_[x].push_back(k);
  }
  for (op_index k = 0; k < p.steps.size(); ++k)
    for (auto o : p.steps[k].recomputes) {
      if (o >= reruns_.size()) continue;
      reruns_[o].push_back(k);
      for (auto x : t.ops[o].reads)
        if (x < rerun_reads_.size() && (rerun_reads_[x].empty() || rerun_reads_[x].back() != k)) rerun_reads_[x].push_back(k);
    }
}

op_index rerun_index::next_rerun_read(tensor_id x, op_index k) const {
  constexpr auto none = std::numeric_limits<op_index>::max();
  if (t_ == nullptr || x >= rerun_reads_.size()) return none;
  const auto& r = rerun_reads_[x];
  auto next = std::upper_bound(r.begin(), r.end(), k);
  if (next == r.end()) return none;
  const op_index w = writer_before(x, *next);
  if (w < reruns_.size()) {
    const auto& at = reruns_[w];
    auto rerun = std::upper_bound(at.begin(), at.end(), k);
    if (rerun != at.end() && *rerun <= *next) return none;  // made again before that read
  }
  return *next;
}

op_index rerun_index::writer_before(tensor_id x, op_index k) const {
  constexpr auto none = std::numeric_limits<op_index>::max();
  if (t_ == nullptr || x >= writes_.size()) return none;
  const auto& w = writes_[x];
  auto it = std::upper_bound(w.begin(), w.end(), k);
  return it == w.begin() ? none : *std::prev(it);
}

bool rerun_index::drop_awaits_rerun(tensor_id x, op_index k) const {
  if (t_ == nullptr || x >= t_->tensors.size() || is_persistent(t_->tensors[x].kind)) return false;
  const op_index w = writer_before(x, k);
  if (w >= t_->ops.size() || !t_->ops[w].recomputable) return false;
  const auto& r = reads_[x];
  auto next_read = std::upper_bound(r.begin(), r.end(), k);
  if (next_read == r.end()) return false;  // nothing reads it again: the usual rule applies
  const auto& at = reruns_[w];
  auto rerun = std::upper_bound(at.begin(), at.end(), k);
  return rerun != at.end() && *rerun <= *next_read;
}

}  // namespace spillway
