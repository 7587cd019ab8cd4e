#include "sage/runtime/Json.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

using sage::runtime::JsonError;
using sage::runtime::JsonValue;
using sage::runtime::parseJson;
using sage::runtime::requiredPath;
using sage::runtime::writeJson;

TEST_CASE("a document round-trips through write and parse, keys in insertion order") {
  JsonValue root = JsonValue::object();
  root.set("zeta", 1);
  root.set("alpha", "text with \"quotes\", \\ and \n");
  JsonValue list = JsonValue::array();
  list.push(1.5);
  list.push(-3);
  list.push(true);
  list.push(nullptr);
  root.set("list", list);
  root.set("empty", JsonValue::object());
  std::string text = writeJson(root);
  CHECK(text.find("zeta") < text.find("alpha"));
  JsonValue again = parseJson(text);
  CHECK(again == root);
  CHECK(writeJson(again) == text);
  CHECK(writeJson(parseJson(writeJson(root, 0)), 0) == writeJson(root, 0));
}

TEST_CASE("numbers: integers print without a fraction, doubles read back exactly") {
  CHECK(writeJson(JsonValue(232448)) == "232448");
  CHECK(writeJson(JsonValue(-7)) == "-7");
  double third = 1.0 / 3.0;
  CHECK(parseJson(writeJson(JsonValue(third))).asNumber() == third);
  CHECK(parseJson("1e3").asInteger() == 1000);
  CHECK(parseJson("-0.25").asNumber() == -0.25);
  CHECK_THROWS_AS(parseJson("2.5").asInteger("tunables.warps"), JsonError);
  CHECK_THROWS_AS(writeJson(JsonValue(1.0 / 0.0 - 1.0 / 0.0)), JsonError);
}

TEST_CASE("strings: escapes and \\u sequences, including surrogate pairs") {
  CHECK(parseJson(R"("a\tb\u00e9\ud83d\ude00")").asString() == "a\tb\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(writeJson(JsonValue(std::string("\x01"))) == "\"\\u0001\"");
}

TEST_CASE("set replaces in place, find and at look members up") {
  JsonValue root = parseJson(R"({"a": 1, "b": 2})");
  root.set("a", 5);
  CHECK(writeJson(root, 0) == R"({"a":5,"b":2})"); // one line: LLVM's compact form
  CHECK(root.find("missing") == nullptr);
  CHECK(root.at("b").asInteger() == 2);
  CHECK_THROWS_WITH_AS(root.at("missing"), "missing key \"missing\"", JsonError);
}

TEST_CASE("wrong kinds name what was read") {
  JsonValue root = parseJson(R"({"warps": "eight"})");
  CHECK_THROWS_WITH_AS(root.at("warps").asInteger("tunables.warps"),
                       "tunables.warps: expected a number, found a string", JsonError);
}

TEST_CASE("malformed text fails with line and column") {
  CHECK_THROWS_WITH_AS(parseJson("{\n  \"a\": 1,\n  \"b\" 2\n}"), "line 3, column 7: Expected : after object key",
                       JsonError);
  CHECK_THROWS_WITH_AS(parseJson("{\n  \"a\": 1,\n  \"a\": 2\n}"), "line 3, column 3: duplicate key \"a\"", JsonError);
  CHECK_THROWS_AS(parseJson(""), JsonError);
  CHECK_THROWS_AS(parseJson("[1, 2"), JsonError);
  CHECK_THROWS_AS(parseJson("{} extra"), JsonError);
  CHECK_THROWS_AS(parseJson(R"({"a": 1, "a": 2})"), JsonError);
  // LLVM's parser reads "01" as 1 (stricter JSON would refuse it); nothing sagegen writes has leading zeros.
  CHECK_THROWS_AS(parseJson("\"unterminated"), JsonError);
  CHECK_THROWS_WITH_AS(parseJson(std::string(300, '[') + std::string(300, ']')),
                       "line 1, column 257: nesting deeper than 256 levels", JsonError);
  CHECK_NOTHROW(parseJson(std::string(256, '[') + std::string(256, ']')));
  CHECK_THROWS_AS(parseJson("tru"), JsonError);
}

TEST_CASE("keys keep their document order through LLVM's parser, nested objects too") {
  const JsonValue root = parseJson(R"({"z": {"y": 1, "b": [{"q": 1, "c": 2}], "a": "\"}{"}, "m": {}, "a": 0})");
  const auto &members = root.asObject();
  REQUIRE(members.size() == 3);
  CHECK(members[0].first == "z");
  CHECK(members[1].first == "m");
  CHECK(members[2].first == "a");
  const auto &inner = members[0].second.asObject();
  CHECK(inner[0].first == "y");
  CHECK(inner[1].first == "b");
  CHECK(inner[2].first == "a");
  CHECK(inner[2].second.asString() == "\"}{");
  CHECK(inner[1].second.asArray()[0].asObject()[0].first == "q");
  CHECK(parseJson(R"({"\u0041b": 1})").asObject()[0].first == "Ab"); // escaped keys are decoded
}

TEST_CASE("a path member with a NUL is refused, not cut short (issue 26)") {
  const JsonValue object = parseJson(R"({"q": "samples/q.npy", "k": "samples/k.npy\u0000.txt", "v": ""})");
  CHECK(requiredPath(object, "q", "[0]") == std::filesystem::path("samples/q.npy"));
  CHECK_THROWS_WITH_AS(requiredPath(object, "k", "[0]"),
                       "[0].k: expected a path without NUL characters, got \\u0000 at character 13", JsonError);
  CHECK_THROWS_WITH_AS(requiredPath(object, "v", "[0]"), "[0].v: must not be empty", JsonError);
  CHECK_THROWS_AS(requiredPath(object, "w", "[0]"), JsonError);
}
