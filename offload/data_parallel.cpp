// Data parallel: one rank's trace with ZeRO's sharded optimizer and its collectives
// (Note [Data parallel] in data_parallel.hpp).
#include "offload/data_parallel.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::offload {

std::string_view to_string(gather_placement g) noexcept { return g == gather_placement::before_use ? "before_use" : "after_step"; }

namespace {

constexpr op_index no_op = std::numeric_limits<op_index>::max();

bool contains(const std::vector<tensor_id>& v, tensor_id x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// Tensors waiting for their collective, and their bytes so far.
struct bucket {
  std::vector<tensor_id> tensors;
  std::uint64_t bytes = 0;
};

class rank_rewrite {
 public:
  rank_rewrite(const trace& t, const data_parallel_options& o) : t_(t), o_(o), n_(o.ranks) {}

  rank_trace run() {
    r_.comm.ranks = n_;
    r_.t.tensors = t_.tensors;
    for (auto& d : r_.t.tensors)
      if (d.kind == tensor_kind::optimizer_state) d.bytes = shard(d.bytes);
    find_gradients();
    find_parameters();
    gathers_before_.resize(t_.ops.size());
    choose_early_steps();
    if (o_.gather == gather_placement::before_use) place_gathers();
    for (op_index k = 0; k < t_.ops.size(); ++k) {
      const auto& op = t_.ops[k];
      for (std::size_t b : gathers_before_[k]) emit_gather(gather_buckets_[b], op_phase::forward, op.layer);
      if (op.phase == op_phase::optimizer) {
        if (early_op_[k]) continue;  // run after its gradients' collective
        emit_early_steps(true);
        if (std::any_of(op.reads.begin(), op.reads.end(), [&](tensor_id x) { return contains(grads_open_.tensors, x); }))
          flush_grads(op.layer);
        emit_optimizer(op);
      } else {
        if (std::any_of(op.reads.begin(), op.reads.end(), [&](tensor_id x) { return contains(params_open_.tensors, x); }))
          flush_params(op.layer);
        r_.t.add_op(op);
        for (tensor_id g : finished_at_[k]) {
          grads_open_.tensors.push_back(g);
          grads_open_.bytes += t_.tensors[g].bytes;
        }
        if (grads_open_.bytes >= o_.bucket_bytes || (k == last_finish_ && !grads_open_.tensors.empty())) flush_grads(op.layer);
      }
    }
    flush_grads(-1);
    emit_early_steps(true);
    flush_params(-1);
    r_.t.validate();
    r_.comm.validate(r_.t);
    return std::move(r_);
  }

 private:
  std::uint64_t shard(std::uint64_t b) const { return (b + n_ - 1) / n_; }

  // Gradients the optimizer reads: each gets a shard; the op that finishes it (its last write
  // outside the optimizer) closes its part of a bucket.
  void find_gradients() {
    finished_at_.resize(t_.ops.size());
    std::vector<op_index> first_use(t_.tensors.size(), no_op), last_write(t_.tensors.size(), no_op);
    std::vector<char> optimizer_reads(t_.tensors.size(), 0);
    for (op_index k = 0; k < t_.ops.size(); ++k) {
      const auto& op = t_.ops[k];
      for (tensor_id x : op.reads) {
        if (first_use[x] == no_op) first_use[x] = k;
        if (op.phase == op_phase::optimizer) optimizer_reads[x] = 1;
      }
      for (tensor_id x : op.writes) {
        if (first_use[x] == no_op) first_use[x] = k;
        if (op.phase != op_phase::optimizer) last_write[x] = k;
      }
    }
    grad_shard_.assign(t_.tensors.size(), no_shard);
    for (tensor_id g = 0; g < t_.tensors.size(); ++g) {
      if (t_.tensors[g].kind != tensor_kind::gradient || !optimizer_reads[g]) continue;
      const op_index f = first_use[g];
      if (contains(t_.ops[f].reads, g) || last_write[g] == no_op)
        throw config_error("data parallel: gradient '" + t_.tensors[g].name + "' is read by op " + std::to_string(f) +
                           " ('" + t_.ops[f].name + "') before the backward pass writes it; each rank reduces the "
                           "gradient of its own micro-batch, so the backward pass must write it first");
      grad_shard_[g] = r_.t.add_tensor(t_.tensors[g].name + ".shard", shard(t_.tensors[g].bytes), tensor_kind::gradient);
      if (o_.stage == zero_stage::two) r_.t.tensors[g].kind = tensor_kind::activation;
      finished_at_[last_write[g]].push_back(g);
      last_finish_ = last_finish_ == no_op ? last_write[g] : std::max(last_finish_, last_write[g]);
    }
  }

  // Parameters the optimizer writes: each gets a shard, gathered into the whole before its next read.
  void find_parameters() {
    param_shard_.assign(t_.tensors.size(), no_shard);
    steps_left_.assign(t_.tensors.size(), 0);
    for (const auto& op : t_.ops) {
      if (op.phase != op_phase::optimizer) continue;
      for (tensor_id w : op.writes) {
        if (t_.tensors[w].kind != tensor_kind::parameter) continue;
        ++steps_left_[w];
        if (param_shard_[w] == no_shard)
          param_shard_[w] = r_.t.add_tensor(t_.tensors[w].name + ".shard", shard(t_.tensors[w].bytes), tensor_kind::parameter);
      }
    }
  }

  // before_use: buckets in the order the iteration first reads the parameters (outside the
  // optimizer), each issued before the first reader of the bucket gather_ahead places earlier.
  // A parameter nothing but the optimizer reads is gathered after its step.
  void place_gathers() {
    std::vector<char> seen(t_.tensors.size(), 0);
    std::vector<op_index> first_reader;  // per bucket
    bucket open;
    op_index open_first = no_op;
    for (op_index k = 0; k < t_.ops.size(); ++k) {
      const auto& op = t_.ops[k];
      if (op.phase == op_phase::optimizer) continue;
      for (tensor_id w : op.reads) {
        if (param_shard_[w] == no_shard || seen[w] || early_param_[w]) continue;
        seen[w] = 1;
        gathered_early_.push_back(w);
        if (open.tensors.empty()) open_first = k;
        open.tensors.push_back(w);
        open.bytes += t_.tensors[w].bytes;
        if (open.bytes >= o_.bucket_bytes) {
          gather_buckets_.push_back(std::move(open));
          first_reader.push_back(open_first);
          open = {};
        }
      }
    }
    if (!open.tensors.empty()) {
      gather_buckets_.push_back(std::move(open));
      first_reader.push_back(open_first);
    }
    for (std::size_t b = 0; b < gather_buckets_.size(); ++b) {
      const std::size_t lead = b >= o_.gather_ahead ? b - o_.gather_ahead : 0;
      gathers_before_[first_reader[lead]].push_back(b);
    }
    std::sort(gathered_early_.begin(), gathered_early_.end());
  }

  void emit_optimizer(op_desc op) {
    const auto written = op.writes;
    auto remap = [&](std::vector<tensor_id>& v) {
      for (auto& x : v) {
        if (grad_shard_[x] != no_shard) x = grad_shard_[x];
        else if (param_shard_[x] != no_shard) x = param_shard_[x];
      }
    };
    remap(op.reads);
    remap(op.writes);
    const double n = n_;
    op.flops /= n;
    op.bytes = shard(op.bytes);
    op.host_flops /= n;
    op.host_bytes = shard(op.host_bytes);
    if (op.measured_seconds) *op.measured_seconds /= n;
    const std::int32_t layer = op.layer;
    const auto partial = op.writes;
    r_.t.add_op(std::move(op));
    // A transient value over this rank's shard (a norm): summed over the ranks.
    for (tensor_id x : partial)
      if (!is_persistent(r_.t.tensors[x].kind)) emit_collective("all_reduce." + r_.t.tensors[x].name, collective_kind::all_reduce,
                                                                {x}, {x}, op_phase::optimizer, layer, r_.t.tensors[x].bytes);
    // after_step (and parameters only the optimizer reads): the shards it wrote wait for a gather,
    // once the last op that steps them has run (a parameter stepped in chunks, by several ops, is
    // gathered once, whole).
    for (tensor_id w : written) {
      if (param_shard_[w] == no_shard || --steps_left_[w] != 0) continue;
      if (std::binary_search(gathered_early_.begin(), gathered_early_.end(), w)) continue;
      params_open_.tensors.push_back(w);
      params_open_.bytes += t_.tensors[w].bytes;
      if (params_open_.bytes >= o_.bucket_bytes) flush_params(layer);
    }
  }

  void flush_grads(std::int32_t layer) {
    if (grads_open_.tensors.empty()) return;
    std::vector<tensor_id> shards;
    for (tensor_id g : grads_open_.tensors) shards.push_back(grad_shard_[g]);
    const auto kind = o_.stage == zero_stage::two ? collective_kind::reduce_scatter : collective_kind::all_reduce;
    emit_early_steps();  // those of the buckets before: their collectives have had a bucket's time
    emit_collective(std::string(to_string(kind)) + ".grads" + std::to_string(grad_buckets_++), kind, grads_open_.tensors,
                    shards, op_phase::backward, layer, grads_open_.bytes);
    for (tensor_id g : grads_open_.tensors) reduced_[g] = static_cast<std::uint32_t>(grad_buckets_);  // 1 + the bucket's number
    grads_open_ = {};
  }

  // The early steps whose gradients were all reduced early_step_lag buckets ago (all of them
  // reduced when `all`) (Note [Data parallel]).
  void emit_early_steps(bool all = false) {
    std::erase_if(early_pending_, [&](op_index k) {
      const auto& op = t_.ops[k];
      const auto ready = [&](tensor_id x) {
        if (grad_shard_[x] == no_shard) return true;
        return reduced_[x] != 0 && (all || reduced_[x] + o_.early_step_lag <= grad_buckets_ + 1);
      };
      if (!std::all_of(op.reads.begin(), op.reads.end(), ready)) return false;
      emit_optimizer(op);
      return true;
    });
  }

  // Optimizer ops to run in the backward pass: those of the parameters read last in the forward
  // pass, up to early_step_share of the parameter bytes, where the op may move.
  void choose_early_steps() {
    early_op_.assign(t_.ops.size(), 0);
    early_param_.assign(t_.tensors.size(), 0);
    reduced_.assign(t_.tensors.size(), 0);
    if (o_.early_step_share <= 0) return;
    std::vector<op_index> first_read(t_.tensors.size(), no_op), last_read(t_.tensors.size(), 0);
    std::vector<op_index> finish(t_.tensors.size(), 0);
    std::vector<std::vector<op_index>> steps_of(t_.tensors.size());
    std::vector<int> optimizer_writers(t_.tensors.size(), 0);
    for (op_index k = 0; k < t_.ops.size(); ++k) {
      const auto& op = t_.ops[k];
      if (op.phase == op_phase::optimizer) {
        for (tensor_id x : op.writes) {
          ++optimizer_writers[x];
          if (param_shard_[x] != no_shard) steps_of[x].push_back(k);
        }
        continue;
      }
      for (tensor_id x : op.reads) {
        if (first_read[x] == no_op) first_read[x] = k;
        last_read[x] = k;
      }
      for (tensor_id x : op.writes) finish[x] = k;
    }
    auto movable = [&](op_index k) {
      const auto& op = t_.ops[k];
      op_index done = 0;  // when its last gradient is finished
      for (tensor_id x : op.reads) {
        if (!is_persistent(t_.tensors[x].kind)) return false;
        const bool own = std::find(op.writes.begin(), op.writes.end(), x) != op.writes.end();
        if (optimizer_writers[x] > (own ? 1 : 0)) return false;  // another optimizer op writes it
        if (grad_shard_[x] != no_shard) done = std::max(done, finish[x]);
      }
      for (tensor_id w : op.writes)
        if (param_shard_[w] != no_shard && last_read[w] > done) return false;  // read after: keep the old value
      return true;
    };
    std::vector<tensor_id> params;
    std::uint64_t total = 0;
    for (tensor_id w = 0; w < t_.tensors.size(); ++w)
      if (param_shard_[w] != no_shard && first_read[w] != no_op) {
        params.push_back(w);
        total += t_.tensors[w].bytes;
      }
    std::stable_sort(params.begin(), params.end(), [&](tensor_id a, tensor_id b) { return first_read[a] > first_read[b]; });
    const double target = o_.early_step_share * static_cast<double>(total);
    double taken = 0;
    for (tensor_id w : params) {
      if (taken >= target) break;
      if (early_param_[w] || !std::all_of(steps_of[w].begin(), steps_of[w].end(), movable)) continue;
      for (op_index k : steps_of[w]) {
        if (early_op_[k]) continue;
        early_op_[k] = 1;
        early_pending_.push_back(k);
        for (tensor_id x : t_.ops[k].writes)
          if (param_shard_[x] != no_shard && !early_param_[x]) {
            early_param_[x] = 1;
            taken += static_cast<double>(t_.tensors[x].bytes);
          }
      }
    }
    std::sort(early_pending_.begin(), early_pending_.end());
  }

  void flush_params(std::int32_t layer) {
    if (params_open_.tensors.empty()) return;
    emit_gather(params_open_, op_phase::optimizer, layer);
    params_open_ = {};
  }

  void emit_gather(const bucket& b, op_phase phase, std::int32_t layer) {
    std::vector<tensor_id> shards;
    for (tensor_id w : b.tensors) shards.push_back(param_shard_[w]);
    emit_collective("all_gather.params" + std::to_string(param_buckets_++), collective_kind::all_gather, shards, b.tensors,
                    phase, layer, b.bytes);
  }

  void emit_collective(std::string name, collective_kind kind, std::vector<tensor_id> reads, std::vector<tensor_id> writes,
                       op_phase phase, std::int32_t layer, std::uint64_t bytes) {
    op_desc op;
    op.name = std::move(name);
    op.reads = std::move(reads);
    op.writes = std::move(writes);
    op.phase = phase;
    op.category = "collective";
    op.layer = layer;
    const op_index k = r_.t.add_op(std::move(op));
    r_.comm.collectives.push_back({k, kind, bytes});
  }

  static constexpr tensor_id no_shard = std::numeric_limits<tensor_id>::max();
  const trace& t_;
  const data_parallel_options& o_;
  std::uint32_t n_;
  rank_trace r_;
  std::vector<tensor_id> grad_shard_, param_shard_;
  std::vector<std::uint32_t> steps_left_;             // per parameter: optimizer ops that write it, not yet emitted
  std::vector<std::vector<tensor_id>> finished_at_;  // per op: gradients it finishes
  op_index last_finish_ = no_op;
  bucket grads_open_, params_open_;
  std::vector<bucket> gather_buckets_;                 // before_use
  std::vector<std::vector<std::size_t>> gathers_before_;  // per op: gather buckets issued before it
  std::vector<tensor_id> gathered_early_;              // sorted: parameters gathered before use
  std::size_t grad_buckets_ = 0, param_buckets_ = 0;
  std::vector<char> early_op_, early_param_;  // early steps, per op and per parameter
  std::vector<std::uint32_t> reduced_;        // per gradient: 1 + the number of the bucket that reduced it, 0: not yet
  std::vector<op_index> early_pending_;                 // early steps not yet emitted, in trace order
};

}  // namespace

rank_trace make_rank_trace(const trace& t, const data_parallel_options& o) {
  if (o.ranks == 0) throw config_error("data parallel: ranks must be at least 1, got 0");
  if (o.bucket_bytes == 0) throw config_error("data parallel: the bucket size must be at least 1 byte, got 0");
  if (o.early_step_lag == 0) throw config_error("data parallel: the early step lag must be at least 1 bucket, got 0");
  if (!(o.early_step_share >= 0 && o.early_step_share <= 1))
    throw config_error("data parallel: the early step share must be from 0 to 1, got " + format_real(o.early_step_share));
  if (o.ranks == 1) return {t, comm_schedule{1, {}}};
  t.validate();
  return rank_rewrite(t, o).run();
}

}  // namespace spillway::offload
