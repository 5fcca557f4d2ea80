// Tests of the Trace type and its JSON form: validation and errors that name the position.
// Round trip through JSON keeps every field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>

#include "device/error.hpp"
#include "offload/trace_json.hpp"

namespace spillway::offload {
namespace {

std::string error_of(const std::string& text) {
  try {
    (void)trace_from_json_text(text);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(Trace, ValidateNamesOpAndField) {
  trace t;
  const auto a = t.add_tensor("a", 16, tensor_kind::activation);
  op_desc op;
  op.name = "uses_a";
  op.reads = {a};
  t.add_op(op);
  try {
    t.validate();
    FAIL() << "a read of an unwritten transient must be refused";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("op 0 ('uses_a')"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'reads'"), std::string::npos) << e.what();
  }
  t.ops[0].reads = {7};
  EXPECT_THROW(t.validate(), config_error);
  t.ops[0].reads = {};
  t.ops[0].writes = {a, a};
  EXPECT_THROW(t.validate(), config_error);
  t.ops[0].writes = {a};
  EXPECT_NO_THROW(t.validate());
  EXPECT_EQ(t.working_set_bytes(0), 16u);
}

TEST(TraceJson, RoundTrip) {
  const auto t = trace_from_json_text(R"({
    "tensors": [{"name": "w", "bytes": "1KiB", "kind": "parameter"},
                {"name": "x", "bytes": 64, "kind": "activation"},
                {"name": "ws", "bytes": 8, "kind": "workspace"},
                {"name": "loss", "bytes": 4, "kind": "metric"}],
    "ops": [{"name": "make_x", "writes": ["x"], "flops": 10},
            {"name": "use", "reads": ["x", 0], "writes": ["ws"], "flops": 2e9, "bytes": 100,
             "seconds": 0.5, "phase": "forward", "category": "matmul", "layer": 3},
            {"name": "loss", "reads": ["ws"], "writes": ["loss"]},
            {"name": "host read: loss", "reads": ["loss"]}]})");
  ASSERT_EQ(t.tensors.size(), 4u);
  EXPECT_EQ(t.tensors[3].kind, tensor_kind::metric);
  EXPECT_FALSE(is_persistent(tensor_kind::metric));
  EXPECT_EQ(t.tensors[0].bytes, 1024u);
  EXPECT_EQ(t.ops[1].reads, (std::vector<tensor_id>{1, 0}));
  EXPECT_EQ(*t.ops[1].measured_seconds, 0.5);
  EXPECT_EQ(t.ops[1].layer, 3);
  const auto back = trace_from_json(trace_to_json(t));
  ASSERT_EQ(back.ops.size(), 4u);
  EXPECT_EQ(back.tensors[3].kind, tensor_kind::metric);
  EXPECT_EQ(back.ops[1].category, "matmul");
  EXPECT_EQ(back.ops[1].phase, op_phase::forward);
  EXPECT_EQ(back.ops[1].flops, 2e9);
  EXPECT_EQ(back.tensors[2].kind, tensor_kind::workspace);
}

TEST(TraceJson, DanglingReferenceNamesOpAndField) {
  const auto msg = error_of(R"({"tensors": [{"name": "x", "bytes": 4, "kind": "activation"}],
    "ops": [{"name": "a", "writes": ["x"]}, {"name": "b", "reads": ["x", "nope"]}]})");
  EXPECT_NE(msg.find("ops[1] ('b')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'reads'[1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
  const auto idx = error_of(R"({"tensors": [], "ops": [{"name": "a", "writes": [3]}]})");
  EXPECT_NE(idx.find("ops[0] ('a') field 'writes'[0]"), std::string::npos) << idx;
}

TEST(TraceJson, MalformedJsonAndFieldsNamePosition) {
  EXPECT_NE(error_of("{\"tensors\": [").find("syntax error at byte"), std::string::npos);
  const auto kind = error_of(R"({"tensors": [{"name": "x", "bytes": 4, "kind": "blob"}], "ops": []})");
  EXPECT_NE(kind.find("tensors[0] ('x')"), std::string::npos) << kind;
  EXPECT_NE(kind.find("'kind'"), std::string::npos) << kind;
  const auto bytes = error_of(R"({"tensors": [{"name": "x", "bytes": "12 parsecs", "kind": "activation"}], "ops": []})");
  EXPECT_NE(bytes.find("tensors[0] ('x') field 'bytes'"), std::string::npos) << bytes;
  const auto missing = error_of(R"({"tensors": []})");
  EXPECT_NE(missing.find("'ops'"), std::string::npos) << missing;
  const auto flops = error_of(R"({"tensors": [], "ops": [{"name": "k", "flops": "many"}]})");
  EXPECT_NE(flops.find("ops[0] ('k') field 'flops'"), std::string::npos) << flops;
  const auto order = error_of(R"({"tensors": [{"name": "x", "bytes": 4, "kind": "activation"}],
    "ops": [{"name": "early", "reads": ["x"]}, {"name": "late", "writes": ["x"]}]})");
  EXPECT_NE(order.find("op 0 ('early')"), std::string::npos) << order;
  EXPECT_THROW(load_trace("/nonexistent/trace.json"), config_error);
  try {
    (void)load_trace(::testing::TempDir());
    ADD_FAILURE() << "a folder was read as a trace";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find(": is a folder; give a trace JSON file"), std::string::npos) << e.what();
  }
  const auto huge = error_of(R"({"tensors": [{"name": "w", "bytes": 18446744073709551615, "kind": "parameter"}], "ops": []})");
  EXPECT_NE(huge.find("tensor 0 ('w')"), std::string::npos) << huge;
  EXPECT_NE(huge.find("above the largest size"), std::string::npos) << huge;
  const auto overflow = error_of(R"({"tensors": [], "ops": [{"name": "k", "flops": 1e999}]})");
  EXPECT_NE(overflow.find("trace JSON: "), std::string::npos) << overflow;  // a config_error, not the parser's own
}

// A layer number past int32 wrapped to another layer (two layers merged in checkpoint's choice);
// below -1 it meant nothing. Both are refused naming the op and the range.
TEST(TraceJson, LayerNumbersOutsideTheirRangeAreRefused) {
  const auto text = [](const std::string& layer) {
    return R"({"tensors": [{"name": "p", "bytes": "1MB", "kind": "parameter"}],
      "ops": [{"name": "f0", "reads": ["p"], "layer": )" + layer + "}]}";
  };
  for (const char* bad : {"99999999999", "2147483648", "-7", "18446744073709551615", "1.5", "\"3\""}) {
    const auto e = error_of(text(bad));
    EXPECT_NE(e.find("ops[0] ('f0')"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("field 'layer' must be a whole number from -1 (no layer) to 2147483647"), std::string::npos)
        << bad << ": " << e;
  }
  EXPECT_EQ(error_of(text("2147483647")), "");
  EXPECT_EQ(error_of(text("-1")), "");
  EXPECT_EQ(trace_from_json_text(text("12")).ops[0].layer, 12);
}

// Op times whose sum is not finite are refused before any planning: two ops of 1e308 s (the
// fuzzer's find) summed to an infinite step. The error names the op, the field and the range.
TEST(TraceJson, OpTimesPastTheLongestOpAreRefused) {
  const auto text = [](const std::string& seconds) {
    return R"({"tensors": [{"name": "p", "bytes": "1GB", "kind": "parameter"}],
      "ops": [{"name": "f0", "reads": ["p"], "seconds": 0.1}, {"name": "f1", "reads": ["p"], "seconds": )" +
           seconds + "}]}";
  };
  const auto e = error_of(text("1e308"));
  EXPECT_NE(e.find("op 1 ('f1')"), std::string::npos) << e;
  EXPECT_NE(e.find("field 'seconds' must be from 0 to 1e+06"), std::string::npos) << e;
  EXPECT_NE(e.find("got 1e+308"), std::string::npos) << e;
  EXPECT_NE(error_of(text("-1")).find("field 'seconds'"), std::string::npos);
  EXPECT_EQ(error_of(text("1e6")), "");  // the longest op allowed
  trace t;
  op_desc op;
  op.name = "k";
  op.flops = std::numeric_limits<double>::infinity();
  t.add_op(op);
  try {
    t.validate();
    FAIL() << "an op of infinite flops was accepted";
  } catch (const config_error& err) {
    EXPECT_NE(std::string(err.what()).find("field 'flops' must be >= 0 and finite"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace spillway::offload
