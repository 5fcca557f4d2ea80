// Session::save and Session::load: every persistent tensor, wherever it lives, to and from one
// checkpoint file (offload/checkpoint.hpp), one tensor at a time through one host buffer.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "offload/checkpoint.hpp"
#include "offload/session_call.hpp"
#include "offload/session_impl.hpp"

namespace spillway {
namespace {

// Note [Checkpointed values]
// A checkpoint holds every persistent tensor the executor keeps (session_impl::checkpoint_ids),
// read with executor::read: from the device when the value is there, else from its tier copy
// (host or NVMe), one tensor at a time into one host buffer as large as the largest tensor, so
// the model is never staged whole in host memory. A gradient that the recorded iteration
// overwrites before reading may have been dropped after its last use (Session::read): its value
// is dead, the next iteration writes it before any op reads it, and the checkpoint holds zeros
// for it. Loading checks everything first (names, sizes, kinds, then every tensor's CRC, reading
// the file once), and only then sets the tensors, one by one, with executor::upload: the tensor
// leaves the device and its value goes to the host tier (NVMe when the host tier is full), as a
// tensor's initial value does; the next iteration brings it back as the plan says.

// Note [State added after load]
// A loop ported as it is often makes its optimizer state on first use: the Adam moments of a
// weight are added in the first step's update, after the loop, resuming, called load(). Such a
// checkpoint holds tensors the Session does not have yet. Optimizer state (only: a parameter or
// gradient missing is another model) is therefore left in the file at load: its name, the folder
// and its size wait in session_impl::awaiting_add, and add_persistent of that name checks the
// size and takes the value from the checkpoint, read again and checked against its CRC, in place
// of the initial value given; a piece of a tensor split into views (saved as its pieces) takes
// its value from there when the views are laid out. A save() before they are all added (or of a
// run that never adds some: frozen layers, another optimizer) copies the ones still waiting
// from the checkpoint they wait in, so no checkpoint drops them, and they then wait in the new
// one.

}  // namespace

void session_impl::take_awaited_value(tensor_id id) {
  const auto it = awaiting_add.find(tensors[id].name);
  if (it == awaiting_add.end()) return;
  const auto& d = tensors[id];
  if (d.kind != tensor_kind::optimizer_state || d.bytes != it->second.bytes)
    throw config_error("add_persistent(\"" + d.name + "\"): the checkpoint loaded from '" + it->second.dir + "' holds it as " +
                       std::to_string(it->second.bytes) + " bytes of optimizer state, and this call gives " +
                       std::to_string(d.bytes) + " bytes of " + std::string(to_string(d.kind)) + "; give the same");
  std::vector<unsigned char> value(d.bytes);
  checkpoint::reader(it->second.dir).read(d.name, value.data());
  exec->upload(id, value.data());
  awaiting_add.erase(it);
}

void Session::save(const std::string& dir, std::string_view meta) {
  auto& s = *impl_;
  const session_detail::session_call claim(s, "save", dir);
  s.end_failed_step();  // a loop that saves after a failed step saves the values it left
  SPILLWAY_EXPECTS_T(usage_error, !s.in_iteration,
                     "save(\"" + dir + "\") inside an iteration; call it after end_iteration()");
  if (dir.empty()) throw config_error("save: the checkpoint folder is an empty string; give a folder");
  const std::vector<tensor_id> ids = s.checkpoint_ids();
  std::vector<checkpoint::entry> entries;
  entries.reserve(ids.size());
  std::uint64_t largest = 0;
  for (auto id : ids) {
    const auto& d = s.tensors[id];
    entries.push_back(checkpoint::entry{d.name, d.bytes, d.kind});
    largest = std::max(largest, d.bytes);
  }
  // Optimizer state still waiting for its add is copied from its checkpoint (Note [State added
  // after load]).
  std::vector<std::pair<std::string, std::string>> copied;  // name, the folder it is read from
  for (const auto& [name, a] : s.awaiting_add) {
    entries.push_back(checkpoint::entry{name, a.bytes, tensor_kind::optimizer_state});
    copied.emplace_back(name, a.dir);
    largest = std::max(largest, a.bytes);
  }
  std::map<std::string, std::unique_ptr<checkpoint::reader>> readers;  // by folder
  for (const auto& [name, from] : copied)
    if (!readers.contains(from)) readers.emplace(from, std::make_unique<checkpoint::reader>(from));
  // Only a gradient may have no value (dropped after its last read); a parameter or optimizer
  // state without one would come back as zeros, so it is refused before anything is written.
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (entries[i].kind != tensor_kind::gradient && !s.holds_value(ids[i]))
      throw usage_error("save(\"" + dir + "\"): " + std::string(to_string(entries[i].kind)) + " \"" + entries[i].name +
                        "\" holds no value, and a checkpoint of it would restore zeros; give it one with write() first");
  std::vector<unsigned char> buffer;  // Note [Checkpointed values]
  checkpoint::write(
      dir, entries,
      [&](std::size_t i, const checkpoint::chunk_sink& sink) {
        if (buffer.size() < largest) buffer.resize(largest);
        if (i >= ids.size()) {  // waiting for its add: its bytes as the checkpoint it waits in has them
          const auto& [name, from] = copied[i - ids.size()];
          readers.at(from)->read(name, buffer.data());
          sink(buffer.data(), entries[i].bytes);
          return;
        }
        const tensor_id id = ids[i];
        if (s.holds_value(id)) {
          s.exec->read(id, buffer.data());
        } else {
          std::memset(buffer.data(), 0, entries[i].bytes);  // a gradient dropped after its last read
        }
        sink(buffer.data(), entries[i].bytes);
      },
      meta, {}, checkpoint::session_state{s.iterations_ended});
  for (auto& [name, a] : s.awaiting_add) a.dir = dir;  // the new checkpoint holds them too
}

std::string Session::load(const std::string& dir) {
  auto& s = *impl_;
  const session_detail::session_call claim(s, "load", dir);
  s.end_failed_step();
  SPILLWAY_EXPECTS_T(usage_error, !s.in_iteration,
                     "load(\"" + dir + "\") inside an iteration; call it after end_iteration()");
  if (dir.empty()) throw config_error("load: the checkpoint folder is an empty string; give a folder");
  const std::vector<tensor_id> ids = s.checkpoint_ids();
  std::vector<checkpoint::entry> expected;
  expected.reserve(ids.size());
  std::uint64_t largest = 0;
  for (auto id : ids) {
    const auto& d = s.tensors[id];
    expected.push_back(checkpoint::entry{d.name, d.bytes, d.kind});
    largest = std::max(largest, d.bytes);
  }
  const checkpoint::reader r(dir);
  // Optimizer state the Session has not added yet waits for its add (Note [State added after load]).
  std::map<std::string, session_impl::awaited_state, std::less<>> awaited;
  for (const auto& c : r.entries()) {
    const bool registered = std::any_of(expected.begin(), expected.end(), [&](const checkpoint::entry& e) { return e.name == c.name; });
    if (registered || c.kind != tensor_kind::optimizer_state || s.by_name.contains(c.name)) continue;
    awaited.emplace(c.name, session_impl::awaited_state{dir, c.bytes});
    expected.push_back(c);
  }
  try {
    r.check_matches(expected, "the Session's persistent tensors");
  } catch (const config_error& e) {
    // A parent split into views is saved as its pieces (Note [Views] in session_views.cpp): a
    // checkpoint made with other views, or none, differs in those names.
    const auto entries = r.entries();
    const bool views = !s.splits.empty() || std::any_of(entries.begin(), entries.end(), [](const checkpoint::entry& c) {
                         return c.name.find('[') != std::string::npos;
                       });
    if (!views) throw;
    throw config_error(std::string(e.what()) +
                       ", or by a Session whose views split its tensors otherwise: a tensor split into views "
                       "(add_view) is saved as its pieces, so load it into a Session that adds the same views");
  }
  r.verify();  // every CRC before any tensor changes (Note [Checkpointed values])
  s.awaiting_add = std::move(awaited);
  std::vector<unsigned char> buffer(largest);
  for (auto id : ids) {
    r.read(s.tensors[id].name, buffer.data());
    s.exec->upload(id, buffer.data());
  }
  s.forget_sums();  // every tensor overwritten (Note [Sums no op read])
  if (r.state()) s.iterations_ended = r.state()->iterations;  // Note [Op seeds] in session.cpp
  return r.meta();
}

}  // namespace spillway
