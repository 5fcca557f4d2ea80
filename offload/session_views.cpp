// Views: named byte ranges of a persistent tensor, so that a loop that keeps its parameters in
// one flat buffer addressed by offsets moves them per layer.
#include <algorithm>
#include <vector>

#include "offload/session_impl.hpp"

namespace spillway {

// Note [Views]
// add_view(parent, offset, bytes) names a byte range of a persistent tensor. While a parent's
// views are pending (added, no op has named the parent yet) nothing moves. Before the first use
// (begin_iteration, a read, a checkpoint) the parent is split once: its bytes are read to the
// host, each view becomes a tensor of its own, each range between views (and before the first,
// after the last) becomes one too, named "PARENT[begin:end]", each is stored from those bytes,
// and the parent's own copy is retired (executor::retire), so the bytes are held once. From then
// on the trace, the planner and the executor see only the pieces: a view named by an op is that
// piece; the parent named by an op is every piece, so an optimizer step over the whole flat
// buffer uses them all and a layer's forward only its own. Each piece is planned and moved on
// its own, which is the point.
//
// An op that names the parent gets one contiguous buffer from ptr(parent): op scratch the size
// of the parent, which the library fills from the pieces (device to device, on the op's stream,
// when the op reads or accumulates the parent) and copies back to the pieces after the op
// (when it writes or accumulates it). The scratch is counted in the least budget of the op.
// So an op over the whole parent costs its bytes twice on the device and a copy each way;
// per-view ops cost nothing extra. An op may not name a parent and one of its views (the two
// pointers would alias different memory). Read and checkpoints see the pieces: read(parent)
// assembles them; a checkpoint stores each piece under its name.

tensor_handle session_impl::add_view(tensor_handle parent, std::uint64_t offset, std::uint64_t bytes,
                                     std::string name) {
  check_handle(parent);
  const auto& pd = tensors[parent.id];
  const std::string what = "add_view(\"" + pd.name + "\", " + std::to_string(offset) + ", " + std::to_string(bytes) + ")";
  SPILLWAY_EXPECTS_T(usage_error, !in_iteration, what + " inside an iteration; add views before begin_iteration()");
  SPILLWAY_EXPECTS_T(usage_error, is_persistent(pd.kind),
                     what + ": \"" + pd.name + "\" is a transient; views are of persistent tensors");
  SPILLWAY_EXPECTS_T(usage_error, !parent_of.contains(parent.id),
                     what + ": \"" + pd.name + "\" is itself a view (or part of a split tensor); view its parent \"" +
                         (parent_of.contains(parent.id) ? tensors[parent_of.at(parent.id)].name : std::string()) + "\"");
  SPILLWAY_EXPECTS_T(usage_error, !is_split(parent.id) && !named_ever.contains(parent.id),
                     what + ": \"" + pd.name +
                         "\" has been used already (its views were fixed before its first use); add every view "
                         "of a tensor before any op or read names it");
  SPILLWAY_EXPECTS_T(config_error, bytes > 0, what + ": a view of 0 bytes; give at least 1");
  SPILLWAY_EXPECTS_T(config_error, offset < pd.bytes && bytes <= pd.bytes - offset,
                     what + ": the range [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                         std::to_string(bytes) + ") is outside the tensor's " + std::to_string(pd.bytes) +
                         " bytes; give offset + bytes <= " + std::to_string(pd.bytes));
  // Looked up, not made: a refused view must leave the parent whole (an entry here splits it).
  if (const auto it = splits.find(parent.id); it != splits.end()) {
    for (const auto& pc : it->second.pieces) {
      const std::uint64_t b = pc.offset, e = pc.offset + tensors[pc.id].bytes;
      SPILLWAY_EXPECTS_T(config_error, offset + bytes <= b || e <= offset,
                         what + " overlaps view \"" + tensors[pc.id].name + "\" [" + std::to_string(b) + ", " +
                             std::to_string(e) + "); views of one tensor do not overlap");
    }
  }
  if (name.empty()) name = pd.name + "[" + std::to_string(offset) + ":" + std::to_string(offset + bytes) + "]";
  SPILLWAY_EXPECTS_T(config_error, !by_name.contains(name),
                     what + ": the name \"" + name + "\" is taken by another tensor; give the view its own name");
  const auto kind = pd.kind;
  const auto id = add_tensor(std::move(name), bytes, kind);
  splits[parent.id].pieces.push_back(piece{id, offset});  // made only now that the view is added
  parent_of[id] = parent.id;
  return tensor_handle{id};
}

void session_impl::finalize_views() {
  for (auto& entry : splits) {
    const tensor_id parent = entry.first;  // a plain name, which lambdas may capture (clang 14 cannot capture a binding)
    auto& sp = entry.second;
    if (sp.finalized) continue;
    const tensor_desc pd = tensors[parent];
    std::vector<std::byte> bytes(pd.bytes);
    exec->read(parent, bytes.data());
    std::sort(sp.pieces.begin(), sp.pieces.end(), [](const piece& a, const piece& b) { return a.offset < b.offset; });
    std::vector<piece> all;
    std::uint64_t at = 0;
    auto gap = [&](std::uint64_t begin, std::uint64_t end) {
      const auto id = add_tensor(pd.name + "[" + std::to_string(begin) + ":" + std::to_string(end) + "]", end - begin, pd.kind);
      parent_of[id] = parent;
      all.push_back(piece{id, begin});
    };
    for (const auto& pc : sp.pieces) {
      if (pc.offset > at) gap(at, pc.offset);
      all.push_back(pc);
      at = pc.offset + tensors[pc.id].bytes;
    }
    if (at < pd.bytes) gap(at, pd.bytes);
    for (const auto& pc : all) {
      if (awaiting_add.contains(tensors[pc.id].name))
        take_awaited_value(pc.id);  // Note [State added after load] in session_checkpoint.cpp
      else
        exec->upload(pc.id, bytes.data() + pc.offset);
    }
    exec->retire(parent);
    sp.pieces = std::move(all);
    sp.finalized = true;
  }
}

std::vector<tensor_id> session_impl::pieces_of(tensor_id id) const {
  if (!is_split(id)) return {id};
  std::vector<tensor_id> out;
  for (const auto& pc : splits.at(id).pieces) out.push_back(pc.id);
  return out;
}

std::vector<tensor_id> session_impl::checkpoint_ids() {
  finalize_views();
  std::vector<tensor_id> out;
  for (tensor_id id = 0; id < tensors.size(); ++id)
    if (is_persistent(tensors[id].kind) && !is_split(id)) out.push_back(id);
  return out;
}

}  // namespace spillway
