// Trace: string forms of the enums and the structural checks on a recorded iteration.
// No planning logic lives here; see offload/ for the analyzer and planners.
#include "prefetch/trace.hpp"

#include <algorithm>
#include <cmath>

#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/enum_names.hpp"

namespace spillway {

namespace {
constexpr std::string_view kind_names[] = {"parameter", "gradient", "optimizer_state", "activation",
                                           "workspace", "metric"};
constexpr std::string_view phase_names[] = {"forward", "backward", "optimizer", "other"};

std::string op_label(const trace& t, op_index i) {
  return "op " + std::to_string(i) + " ('" + t.ops[i].name + "')";
}
}  // namespace

std::string_view to_string(tensor_kind k) noexcept { return detail::enum_name(kind_names, k); }

std::optional<tensor_kind> parse_tensor_kind(std::string_view s) noexcept {
  return detail::parse_enum<tensor_kind>(kind_names, s);
}

std::string_view to_string(op_phase p) noexcept { return detail::enum_name(phase_names, p); }

std::optional<op_phase> parse_op_phase(std::string_view s) noexcept { return detail::parse_enum<op_phase>(phase_names, s); }

tensor_id trace::add_tensor(std::string name, std::uint64_t bytes, tensor_kind kind) {
  tensors.push_back({std::move(name), bytes, kind});
  return static_cast<tensor_id>(tensors.size() - 1);
}

op_index trace::add_op(op_desc op) {
  ops.push_back(std::move(op));
  return static_cast<op_index>(ops.size() - 1);
}

op_index trace::add_op(std::string name, std::vector<tensor_id> reads, std::vector<tensor_id> writes) {
  op_desc d;
  d.name = std::move(name);
  d.reads = std::move(reads);
  d.writes = std::move(writes);
  return add_op(std::move(d));
}

std::optional<tensor_id> trace::find_tensor(std::string_view name) const {
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return static_cast<tensor_id>(i);
  return std::nullopt;
}

void trace::validate() const {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].bytes == 0)
      throw config_error("trace: tensor " + std::to_string(i) + " ('" + tensors[i].name +
                         "'): field 'bytes' must be positive");
    if (tensors[i].bytes > max_size_bytes)
      throw config_error("trace: tensor " + std::to_string(i) + " ('" + tensors[i].name + "'): field 'bytes' is " +
                         std::to_string(tensors[i].bytes) + ", above the largest size Spillway accepts (" +
                         format_bytes(max_size_bytes) + ")");
  }
  std::vector<char> written(tensors.size(), 0);
  std::vector<tensor_id> seen;
  for (op_index i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    for (const auto* list : {&op.reads, &op.writes}) {
      const char* field = list == &op.reads ? "reads" : "writes";
      seen.assign(list->begin(), list->end());
      std::sort(seen.begin(), seen.end());
      for (std::size_t k = 0; k < seen.size(); ++k) {
        if (seen[k] >= tensors.size())
          throw config_error("trace: " + op_label(*this, i) + ": field '" + field + "' names tensor " +
                             std::to_string(seen[k]) + ", but there are only " +
                             std::to_string(tensors.size()) + " tensors");
        if (k > 0 && seen[k] == seen[k - 1])
          throw config_error("trace: " + op_label(*this, i) + ": field '" + field + "' lists tensor '" +
                             tensors[seen[k]].name + "' twice");
      }
    }
    for (tensor_id r : op.reads)
      if (!is_persistent(tensors[r].kind) && !written[r])
        throw config_error("trace: " + op_label(*this, i) + ": field 'reads' names transient tensor '" +
                           tensors[r].name + "' before any op writes it");
    if (op.recomputable)
      for (tensor_id w : op.writes) {
        if (is_persistent(tensors[w].kind))
          throw config_error("trace: " + op_label(*this, i) + ": field 'recomputable' is true but the op writes " +
                             std::string(to_string(tensors[w].kind)) + " '" + tensors[w].name +
                             "'; a recomputable op writes only activations, workspaces or metrics");
        if (std::find(op.reads.begin(), op.reads.end(), w) != op.reads.end())
          throw config_error("trace: " + op_label(*this, i) + ": field 'recomputable' is true but the op reads and writes '" +
                             tensors[w].name + "' (in place); a rerun would not see the input it first had");
      }
    for (tensor_id w : op.writes) written[w] = 1;
    if (!(op.flops >= 0) || !std::isfinite(op.flops))
      throw config_error("trace: " + op_label(*this, i) + ": field 'flops' must be >= 0 and finite, got " +
                         format_real(op.flops));
    if (op.measured_seconds && !(*op.measured_seconds >= 0 && *op.measured_seconds <= max_op_seconds))
      throw config_error("trace: " + op_label(*this, i) + ": field 'seconds' must be from 0 to " + format_real(max_op_seconds) +
                         " (about 11.6 days, longer than any op of a training step), got " +
                         format_real(*op.measured_seconds));
    if (!(op.host_flops >= 0) || !std::isfinite(op.host_flops))
      throw config_error("trace: " + op_label(*this, i) + ": field 'host_flops' must be >= 0 and finite, got " +
                         format_real(op.host_flops));
    if (op.host_capable && op.recomputable)
      throw config_error("trace: " + op_label(*this, i) +
                         ": fields 'host_capable' and 'recomputable' are both true; an op that may run on the host "
                         "is not rerun (Note [Host ops])");
  }
}

std::uint64_t trace::working_set_bytes(op_index op) const {
  const auto& o = ops[op];
  std::uint64_t sum = 0;
  for (tensor_id r : o.reads) sum += tensors[r].bytes;
  for (tensor_id w : o.writes)
    if (std::find(o.reads.begin(), o.reads.end(), w) == o.reads.end()) sum += tensors[w].bytes;
  return sum;
}

}  // namespace spillway
