// Options every example shares: the session_config (backend, budgets, tiers, policy, ...) and the
// example's own (steps, seed, size preset). Filled by the programs' flags or by tests and bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "examples/common/precision.hpp"
#include "offload/session_config.hpp"

namespace spillway::examples {

/// Model sizes. tiny: for tests (milliseconds a step); small: the default, about a second a
/// step on the 2-core cpu backend and a footprint inside its default 1 GiB; medium and large:
/// for a GPU.
enum class preset { tiny, small, medium, large };

[[nodiscard]] const char* to_string(preset p) noexcept;
/// Parses "tiny", "small" (also "default"), "medium", "large"; config_error quoting the text.
[[nodiscard]] preset parse_preset(const std::string& text);

/// An example's settings: the Session's own (a session_config, checked by its validate()) and
/// the example's (steps, seed, size, data, a budget as a ratio of the footprint).
struct example_options : session_config {
  double budget_ratio = 0;               ///< > 0: device budget = ratio x footprint
  int steps = 10;
  std::uint64_t seed = 1;
  preset size = preset::small;
  precision prec = precision::fp32;    ///< --precision: fp32, or bf16 mixed precision (Note [Mixed precision])
  std::string data;                      ///< gpt: text file to train on (empty: generated corpus)
  std::string save;                      ///< folder to save a checkpoint into at the end (empty: none)
  int save_every = 0;                    ///< > 0: also save every this many steps
  std::string resume;                    ///< folder of a checkpoint to continue from (empty: start afresh)
  /// > 0: before each Adam step, scale all gradients together so that their global norm is at
  /// most this (parameter_set::clip_grad_norm); 0: no clipping.
  double clip_grad_norm = 0;
  /// Data parallel (Note [Micro-batches] in examples/common/parameters.cpp): > 1 splits each
  /// step's batch into this many equal micro-batches, each one's gradient computed into a zeroed
  /// buffer and the buffers added in order in fp32: the bits a run on as many ranks gives.
  int micro_batches = 1;
  /// --data-parallel: every process of the job (mpirun -np N) trains on its share of each step's
  /// batch, the gradients reduced across ranks and the optimizer state sharded (ZeRO stage `zero`).
  bool data_parallel = false;
  int zero = 2;                          ///< --zero: 1 (gradients all-reduced) or 2 (reduce-scattered)
  /// --bucket-kib: with --data-parallel, gradients are reduced in buckets of about this many
  /// bytes, each queued as soon as the backward pass has produced it (Note [Overlapped gradient
  /// exchange] in examples/common/gradient_exchange.hpp).
  std::uint64_t bucket_bytes = std::uint64_t{1} << 20;
  /// --comm-timeout: with --data-parallel, how long a collective waits for the other ranks
  /// (comm::comm_options::timeout), in seconds; 0 waits for ever.
  double comm_timeout_s = 120;

  /// session_config::validate, then the example's own settings; config_error naming the first
  /// bad one (by its flag or variable) and quoting its value. Checks the checkpoint folders
  /// before any work: --save's can be written (or made), --resume's holds a checkpoint of a run
  /// with this seed that stopped before --steps.
  void validate() const;
};

/// What a checkpoint's meta holds for the harness: where the loop goes on. Every model derives
/// its batch and its Adam step (and so the warmup's learning rate) from the step index and the
/// seed; nothing else lives outside the Session.
/// The model's shape settings ride along, so that a run resumed with others is refused by name
/// before any work (empty or 0 in a meta written before they were: not checked).
struct resume_point {
  std::int64_t next_step = 0;  ///< 0-based index of the step to run next (= steps done)
  std::uint64_t seed = 0;
  std::string preset;          ///< --preset of the run that saved it
  std::string precision;       ///< --precision
  int micro_batches = 0;       ///< --micro-batches (its gradient sums are persistent tensors)
};

/// The resume point of a run with options `o` after `next_step` steps.
[[nodiscard]] resume_point resume_point_of(const example_options& o, std::int64_t next_step);

/// Note [Rank checkpoints]
/// A data-parallel job's ranks each hold their own shard of the optimizer state, so each saves its
/// Session into a folder of its own inside --save's, "rank-R-of-N", and a resumed job of N ranks
/// loads rank R's; a job of another size is refused (its shards would not line up). Every rank
/// saves after the same step with the same meta. In one process (--micro-batches too) the
/// checkpoint is --save's folder itself.
[[nodiscard]] std::string rank_folder(const std::string& dir, int rank, int ranks);

/// Empty when this process can make an entry in the folder `dir`, else why not: one is made and
/// removed again, named after the process so that ranks checking the same folder at once do not
/// meet. access() alone says yes where the file system then refuses (a root-squashed NFS export,
/// procfs), and the output would be lost after the work that made it.
std::string cannot_write_in(const std::string& dir);

/// The meta text of a checkpoint at `p` ("spillway-example 1\nnext_step N\nseed S\npreset P\n...").
[[nodiscard]] std::string to_meta(const resume_point& p);
/// Parses to_meta's text; config_error naming `where` (the --resume folder) when it is not.
[[nodiscard]] resume_point parse_meta(const std::string& meta, const std::string& where);

/// The session_config for these options with the given device budget (0 = the device's memory).
[[nodiscard]] session_config make_session_config(const example_options& o, std::uint64_t device_budget);

}  // namespace spillway::examples
