// A small JSON value for sagegen's own files (AOT manifests, the tuning database, layer choices), parsed and
// written with LLVM's JSON library (llvm/Support/JSON.h). Objects keep their keys in document / insertion order so
// written files are deterministic and diffable. Numbers are doubles (every integer sagegen writes is far below
// 2^53); integral values print without a fraction. Parse errors carry line and column.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace sage::runtime {

class JsonError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class JsonValue {
public:
  using Array = std::vector<JsonValue>;
  using Member = std::pair<std::string, JsonValue>;
  using Object = std::vector<Member>;
  enum class Kind { null, boolean, number, string, array, object };

  JsonValue() = default;
  JsonValue(std::nullptr_t) {}
  JsonValue(bool value) : value_(value) {}
  JsonValue(double value) : value_(value) {}
  JsonValue(int value) : value_(static_cast<double>(value)) {}
  JsonValue(long value) : value_(static_cast<double>(value)) {}
  JsonValue(long long value) : value_(static_cast<double>(value)) {}
  JsonValue(unsigned value) : value_(static_cast<double>(value)) {}
  JsonValue(unsigned long value) : value_(static_cast<double>(value)) {}
  JsonValue(unsigned long long value) : value_(static_cast<double>(value)) {}
  JsonValue(const char *value) : value_(std::string(value)) {}
  JsonValue(std::string value) : value_(std::move(value)) {}
  JsonValue(std::string_view value) : value_(std::string(value)) {}
  JsonValue(Array value) : value_(std::move(value)) {}
  JsonValue(Object value) : value_(std::move(value)) {}

  static JsonValue array() { return JsonValue(Array{}); }
  static JsonValue object() { return JsonValue(Object{}); }

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool isNull() const { return kind() == Kind::null; }
  bool isBool() const { return kind() == Kind::boolean; }
  bool isNumber() const { return kind() == Kind::number; }
  bool isString() const { return kind() == Kind::string; }
  bool isArray() const { return kind() == Kind::array; }
  bool isObject() const { return kind() == Kind::object; }

  // Typed access; a wrong kind throws JsonError naming `what` (e.g. "manifest.kernels[2].registers").
  bool asBool(std::string_view what = "value") const;
  double asNumber(std::string_view what = "value") const;
  std::int64_t asInteger(std::string_view what = "value") const; // also rejects fractions
  const std::string &asString(std::string_view what = "value") const;
  const Array &asArray(std::string_view what = "value") const;
  Array &asArray(std::string_view what = "value");
  const Object &asObject(std::string_view what = "value") const;
  Object &asObject(std::string_view what = "value");

  // Object members. find() returns null when absent; at() throws JsonError naming the key; set() replaces
  // an existing key in place or appends a new one.
  const JsonValue *find(std::string_view key) const;
  JsonValue *find(std::string_view key);
  const JsonValue &at(std::string_view key) const;
  JsonValue &set(std::string_view key, JsonValue value);
  // Arrays.
  JsonValue &push(JsonValue value);

  friend bool operator==(const JsonValue &a, const JsonValue &b) { return a.value_ == b.value_; }

private:
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> value_{nullptr};
};

// "null", "a boolean", "a number", "a string", "an array", "an object": for messages.
std::string_view nameOf(JsonValue::Kind kind);

// Reading sagegen's files, where `where` names the object in messages (e.g. "devices[0].entries[2]"):
// the member `key` (JsonError "<where>: missing \"<key>\"" when absent), and a member that must be a non-empty
// string (JsonError "<where>.<key>: ..." otherwise).
const JsonValue &requiredMember(const JsonValue &object, std::string_view key, const std::string &where);
std::string requiredNonEmptyString(const JsonValue &object, std::string_view key, const std::string &where);
// A member that names a file: a non-empty string without NUL (JSON's \u0000 would cut the path short where the
// operating system reads it, so a different file would be opened).
std::filesystem::path requiredPath(const JsonValue &object, std::string_view key, const std::string &where);

// Throws JsonError("line L, column C: ...") on malformed text, trailing garbage or nesting deeper than 256.
JsonValue parseJson(std::string_view text);
// Pretty-printed with `indent` spaces per level (0: one line, no spaces), ending without a newline. Non-finite numbers
// throw JsonError (JSON cannot carry them).
std::string writeJson(const JsonValue &value, int indent = 2);

} // namespace sage::runtime
