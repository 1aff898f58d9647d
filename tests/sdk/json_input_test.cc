// Outside JSON (sdk loom/cpp/json_input.h): nesting deeper than kMaxJsonDepth, numbers beyond
// double and syntax errors are Errors naming the source, line and column (never nlohmann's
// exceptions, never a stack overflow); JsonIn names the JSON pointer of every value of the
// wrong type or range.
#include "loom/cpp/json_input.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

// The outcome of `body`: "" when it returns, else "<code>: <message>".
template <class Body>
std::string outcome(Body&& body) {
  try {
    body();
    return "";
  } catch (const Error& e) {
    return std::string(code_name(e.code())) + ": " + e.what();
  }
}

TEST(JsonInput, RefusesDeepNestingBeforeParsing) {
  // 100,000 deep overflowed the stack of every recursive walk before the cap.
  std::string deep(100000, '[');
  std::string message = outcome([&] { parse_json_input(deep, "x.json"); });
  std::printf("deep: %s\n", message.c_str());
  EXPECT_NE(message.find("x.json:1:257: JSON nested deeper than 256"), std::string::npos)
      << message;
  // Exactly at the cap parses; brackets inside strings do not count.
  std::string at_cap = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(outcome([&] { parse_json_input(at_cap, "x.json"); }), "");
  std::string quoted = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_EQ(outcome([&] { parse_json_input(quoted, "x.json"); }), "");
  EXPECT_EQ(json_too_deep_at(std::string(kMaxJsonDepth + 1, '{'), kMaxJsonDepth),
            static_cast<size_t>(kMaxJsonDepth));
}

TEST(JsonInput, NumberOverflowAndSyntaxNameThePlace) {
  std::string big = outcome([] { parse_json_input("{\"lr\": 1e309}", "spec a.json"); });
  std::printf("overflow: %s\n", big.c_str());
  EXPECT_EQ(big.rfind("invalid_argument: spec a.json:1:8: number overflow parsing '1e309'", 0), 0u)
      << big;
  std::string bad = outcome(
      [] { parse_json_input("{\n  \"a\": tru\n}", "m.json", Code::kDataLoss, "re-save it"); });
  std::printf("syntax: %s\n", bad.c_str());
  EXPECT_EQ(bad.rfind("data_loss: m.json:2:", 0), 0u) << bad;
  EXPECT_NE(bad.find("syntax error"), std::string::npos) << bad;
  EXPECT_NE(bad.find("; re-save it"), std::string::npos) << bad;
  EXPECT_EQ(parse_json_input("{\"a\": [1, 2]}", "ok.json")["a"][1], 2);
}

TEST(JsonInput, AccessorsNameFileAndPointer) {
  nlohmann::json j = nlohmann::json::parse(R"({"tensors": [{"shape": false, "n/a~": 1.5},
      {"shape": [2, -1]}, {"shape": [3, 4.0]}], "big": 18446744073709551615, "name": 7})");
  JsonIn root(j, "ckpt/metadata.json", Code::kDataLoss);
  auto fails = [](auto&& f) { return outcome(f); };
  EXPECT_EQ(fails([&] { root["tensors"][0]["shape"].int64_array(); }),
            "data_loss: ckpt/metadata.json: /tensors/0/shape: expected an array of integers, "
            "got false");
  EXPECT_EQ(fails([&] { root["tensors"][0]["n/a~"].int64(); }),
            "data_loss: ckpt/metadata.json: /tensors/0/n~1a~0: expected an integer, got 1.5");
  EXPECT_EQ(fails([&] { root["tensors"][1]["shape"].int64_array(0, kMaxJsonSize); }),
            "data_loss: ckpt/metadata.json: /tensors/1/shape/1: integer -1 is outside [0, "
            "1099511627776]");
  EXPECT_EQ(root["tensors"][2]["shape"].int64_array(), (std::vector<int64_t>{3, 4}));
  EXPECT_NE(fails([&] { root["big"].int64(); }).find("/big: integer 18446744073709551615 is "
                                                      "outside"),
            std::string::npos);
  EXPECT_EQ(fails([&] { root["name"].string(); }),
            "data_loss: ckpt/metadata.json: /name: expected a string, got 7");
  EXPECT_EQ(fails([&] { root["missing"]; }),
            "data_loss: ckpt/metadata.json: has no entry \"missing\"");
  EXPECT_EQ(fails([&] { root["tensors"][5]; }),
            "data_loss: ckpt/metadata.json: /tensors: has 3 elements, element 5 was asked for");
  EXPECT_EQ(fails([&] { root["name"]["x"]; }),
            "data_loss: ckpt/metadata.json: /name: expected an object, got 7");
  EXPECT_EQ(root["tensors"].elements().size(), 3u);
  EXPECT_TRUE(root.has("big"));
  EXPECT_FALSE(root["name"].has("big"));
}

}  // namespace
}  // namespace loom
