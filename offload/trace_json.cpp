// Trace JSON reader and writer (nlohmann-json). Every error names where in the document it is,
// so a user fixing a hand-written or exported trace knows which entry to look at.
#include "offload/trace_json.hpp"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/text_file.hpp"

namespace spillway::offload {

namespace {
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& msg) {
  throw config_error("trace JSON: " + where + ": " + msg);
}

std::uint64_t read_bytes(const json& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() < 0) fail(where, "must not be negative");
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  }
  if (v.is_string()) {
    try {
      return parse_size(v.get<std::string>(), where);
    } catch (const config_error& e) {
      fail(where, e.what());
    }
  }
  fail(where, "must be a byte count or a size string such as \"16MiB\"");
}

double read_number(const json& v, const std::string& where) {
  if (!v.is_number()) fail(where, "must be a number");
  return v.get<double>();
}
}  // namespace

trace trace_from_json(const json& j) {
  if (!j.is_object()) fail("top level", "must be an object with 'tensors' and 'ops'");
  if (!j.contains("tensors") || !j["tensors"].is_array()) fail("top level", "field 'tensors' (array) is missing");
  if (!j.contains("ops") || !j["ops"].is_array()) fail("top level", "field 'ops' (array) is missing");
  trace t;
  std::unordered_map<std::string, tensor_id> by_name;
  const auto& ts = j["tensors"];
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& e = ts[i];
    std::string where = "tensors[" + std::to_string(i) + "]";
    if (!e.is_object()) fail(where, "must be an object");
    if (!e.contains("name") || !e["name"].is_string()) fail(where, "field 'name' (string) is missing");
    const auto name = e["name"].get<std::string>();
    where += " ('" + name + "')";
    if (!e.contains("bytes")) fail(where, "field 'bytes' is missing");
    const auto bytes = read_bytes(e["bytes"], where + " field 'bytes'");
    if (bytes == 0) fail(where, "field 'bytes' must be positive");
    if (!e.contains("kind") || !e["kind"].is_string()) fail(where, "field 'kind' (string) is missing");
    const auto kind = parse_tensor_kind(e["kind"].get<std::string>());
    if (!kind)
      fail(where, "field 'kind' is '" + e["kind"].get<std::string>() +
                      "'; expected parameter, gradient, optimizer_state, activation, workspace or metric");
    if (!by_name.emplace(name, static_cast<tensor_id>(i)).second) fail(where, "duplicate tensor name");
    t.add_tensor(name, bytes, *kind);
  }
  const auto& os = j["ops"];
  for (std::size_t i = 0; i < os.size(); ++i) {
    const auto& e = os[i];
    std::string where = "ops[" + std::to_string(i) + "]";
    if (!e.is_object()) fail(where, "must be an object");
    op_desc op;
    if (!e.contains("name") || !e["name"].is_string()) fail(where, "field 'name' (string) is missing");
    op.name = e["name"].get<std::string>();
    where += " ('" + op.name + "')";
    for (const char* field : {"reads", "writes"}) {
      auto& out = field[0] == 'r' ? op.reads : op.writes;
      if (!e.contains(field)) continue;
      const auto& list = e[field];
      if (!list.is_array()) fail(where, std::string("field '") + field + "' must be an array");
      for (std::size_t k = 0; k < list.size(); ++k) {
        const auto& ref = list[k];
        const std::string at = where + " field '" + field + "'[" + std::to_string(k) + "]";
        if (ref.is_string()) {
          auto it = by_name.find(ref.get<std::string>());
          if (it == by_name.end()) fail(at, "unknown tensor '" + ref.get<std::string>() + "'");
          out.push_back(it->second);
        } else if (ref.is_number_integer()) {
          const auto idx = ref.get<std::int64_t>();
          if (idx < 0 || static_cast<std::size_t>(idx) >= t.tensors.size())
            fail(at, "tensor index " + std::to_string(idx) + " out of range");
          out.push_back(static_cast<tensor_id>(idx));
        } else {
          fail(at, "must be a tensor name or index");
        }
      }
    }
    if (e.contains("flops")) op.flops = read_number(e["flops"], where + " field 'flops'");
    if (e.contains("bytes")) op.bytes = read_bytes(e["bytes"], where + " field 'bytes'");
    if (e.contains("seconds")) op.measured_seconds = read_number(e["seconds"], where + " field 'seconds'");
    if (e.contains("phase")) {
      if (!e["phase"].is_string()) fail(where, "field 'phase' must be a string");
      auto p = parse_op_phase(e["phase"].get<std::string>());
      if (!p) fail(where, "field 'phase' must be forward, backward, optimizer or other");
      op.phase = *p;
    }
    if (e.contains("category")) {
      if (!e["category"].is_string()) fail(where, "field 'category' must be a string");
      op.category = e["category"].get<std::string>();
    }
    if (e.contains("recomputable")) {
      if (!e["recomputable"].is_boolean()) fail(where, "field 'recomputable' must be true or false");
      op.recomputable = e["recomputable"].get<bool>();
    }
    if (e.contains("host_capable")) {
      if (!e["host_capable"].is_boolean()) fail(where, "field 'host_capable' must be true or false");
      op.host_capable = e["host_capable"].get<bool>();
    }
    if (e.contains("host_flops")) op.host_flops = read_number(e["host_flops"], where + " field 'host_flops'");
    if (e.contains("host_bytes")) op.host_bytes = read_bytes(e["host_bytes"], where + " field 'host_bytes'");
    if ((op.host_flops > 0 || op.host_bytes > 0) && !op.host_capable)
      fail(where, "fields 'host_flops' and 'host_bytes' need 'host_capable': true");
    if (e.contains("layer")) {
      const auto& l = e["layer"];
      // -1: no layer (what the writer puts for an op outside any); a number past int32 would wrap.
      if (!l.is_number_integer() || l.get<std::int64_t>() < -1 || l.get<std::int64_t>() > INT32_MAX ||
          (l.is_number_unsigned() && l.get<std::uint64_t>() > INT32_MAX))
        fail(where, "field 'layer' must be a whole number from -1 (no layer) to " + std::to_string(INT32_MAX) + ", not " +
                        l.dump());
      op.layer = static_cast<std::int32_t>(l.get<std::int64_t>());
    }
    t.add_op(std::move(op));
  }
  t.validate();
  return t;
}

trace trace_from_json_text(std::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw config_error("trace JSON: syntax error at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {  // valid syntax the parser still refuses: a number past a double
    throw config_error(std::string("trace JSON: ") + e.what());
  }
  return trace_from_json(j);
}

trace load_trace(const std::string& path) {
  const std::string text = read_text_file(path, "the trace", "a trace JSON file, as trace_to_json writes");
  try {
    return trace_from_json_text(text);
  } catch (const config_error& e) {
    throw config_error(path + ": " + e.what());
  }
}

json trace_to_json(const trace& t) {
  json j;
  auto& ts = j["tensors"] = json::array();
  for (const auto& x : t.tensors) ts.push_back({{"name", x.name}, {"bytes", x.bytes}, {"kind", to_string(x.kind)}});
  auto& os = j["ops"] = json::array();
  for (const auto& op : t.ops) {
    json e{{"name", op.name}, {"reads", op.reads}, {"writes", op.writes}, {"flops", op.flops},
           {"bytes", op.bytes}, {"phase", to_string(op.phase)}};
    if (op.measured_seconds) e["seconds"] = *op.measured_seconds;
    if (!op.category.empty()) e["category"] = op.category;
    if (op.layer >= 0) e["layer"] = op.layer;
    if (op.recomputable) e["recomputable"] = true;
    if (op.host_capable) {
      e["host_capable"] = true;
      e["host_flops"] = op.host_flops;
      e["host_bytes"] = op.host_bytes;
    }
    os.push_back(std::move(e));
  }
  return j;
}

}  // namespace spillway::offload
