#include "sage/runtime/Json.h"

#include <fmt/core.h>
#include <llvm/ADT/StringRef.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace sage::runtime {
namespace {

[[noreturn]] void wrongKind(std::string_view what, const char *expected, JsonValue::Kind actual) {
  throw JsonError(fmt::format("{}: expected {}, found {}", what, expected, nameOf(actual)));
}

// "line L, column C: message" for the 1-based position of byte `offset`.
std::string at(std::string_view text, size_t offset, std::string_view message) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}: {}", line, column, message);
}

// llvm::json objects forget the order of their keys, and sagegen's documents keep it (written files stay
// diffable). Over text LLVM has accepted, this records each object's keys in document order (objects in the
// order their '{' appears), and refuses nesting deeper than kMaxDepth before LLVM's recursive parser sees it.
constexpr int kMaxDepth = 256;

struct KeyOrder {
  std::vector<std::vector<std::pair<std::string, size_t>>> objects; // raw key tokens (with quotes) and offsets
};

// Checks the nesting depth only (LLVM has not run yet); with `order`, also records keys (text already valid).
void scanStructure(std::string_view text, KeyOrder *order) {
  std::vector<int> open_objects; // index into order->objects, or -1 for an array
  bool in_string = false;
  size_t string_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"') {
        in_string = false;
        if (order && !open_objects.empty() && open_objects.back() >= 0) {
          size_t next = i + 1;
          while (next < text.size() &&
                 (text[next] == ' ' || text[next] == '\t' || text[next] == '\n' || text[next] == '\r'))
            ++next;
          if (next < text.size() && text[next] == ':')
            order->objects[open_objects.back()].emplace_back(
                std::string(text.substr(string_start, i + 1 - string_start)), string_start);
        }
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_start = i;
    } else if (c == '{' || c == '[') {
      if (static_cast<int>(open_objects.size()) >= kMaxDepth)
        throw JsonError(at(text, i, "nesting deeper than 256 levels"));
      if (c == '{' && order) {
        open_objects.push_back(static_cast<int>(order->objects.size()));
        order->objects.emplace_back();
      } else {
        open_objects.push_back(-1);
      }
    } else if ((c == '}' || c == ']') && !open_objects.empty()) {
      open_objects.pop_back();
    }
  }
}

// LLVM's "[L:C, byte=O]: message" as sagegen's "line L, column C: message".
std::string parseErrorText(llvm::Error error) {
  std::string text = llvm::toString(std::move(error));
  unsigned line = 0, column = 0, offset = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "[%u:%u, byte=%u]: %n", &line, &column, &offset, &consumed) == 3 && consumed > 0)
    return fmt::format("line {}, column {}: {}", line, column, text.substr(static_cast<size_t>(consumed)));
  return text;
}

class Converter {
public:
  Converter(std::string_view text, KeyOrder order) : text_(text), order_(std::move(order)) {}

  JsonValue convert(const llvm::json::Value &value) {
    switch (value.kind()) {
    case llvm::json::Value::Null:
      return JsonValue();
    case llvm::json::Value::Boolean:
      return JsonValue(*value.getAsBoolean());
    case llvm::json::Value::Number:
      if (std::optional<int64_t> integer = value.getAsInteger())
        return JsonValue(static_cast<long long>(*integer));
      return JsonValue(*value.getAsNumber());
    case llvm::json::Value::String:
      return JsonValue(std::string(*value.getAsString()));
    case llvm::json::Value::Array: {
      JsonValue array = JsonValue::array();
      for (const llvm::json::Value &item : *value.getAsArray())
        array.push(convert(item));
      return array;
    }
    case llvm::json::Value::Object:
      return convertObject(*value.getAsObject());
    }
    return JsonValue();
  }

private:
  JsonValue convertObject(const llvm::json::Object &object) {
    if (next_object_ >= order_.objects.size())
      throw JsonError("internal: the JSON key scan disagrees with the parser");
    const auto &keys = order_.objects[next_object_++];
    JsonValue result = JsonValue::object();
    for (const auto &[raw_key, offset] : keys) {
      llvm::Expected<llvm::json::Value> decoded = llvm::json::parse(raw_key);
      if (!decoded)
        throw JsonError(at(text_, offset, parseErrorText(decoded.takeError())));
      const std::string key(*decoded->getAsString());
      if (result.find(key))
        throw JsonError(at(text_, offset, fmt::format("duplicate key \"{}\"", key)));
      const llvm::json::Value *member = object.get(key);
      if (!member)
        throw JsonError("internal: the JSON key scan disagrees with the parser");
      result.asObject().emplace_back(key, convert(*member));
    }
    if (keys.size() != object.size())
      throw JsonError("internal: the JSON key scan disagrees with the parser");
    return result;
  }

  std::string_view text_;
  KeyOrder order_;
  size_t next_object_ = 0;
};

void writeValue(llvm::json::OStream &out, const JsonValue &value) {
  switch (value.kind()) {
  case JsonValue::Kind::null:
    out.value(nullptr);
    return;
  case JsonValue::Kind::boolean:
    out.value(value.asBool());
    return;
  case JsonValue::Kind::number: {
    const double number = value.asNumber();
    if (!std::isfinite(number))
      throw JsonError("cannot write a non-finite number as JSON");
    if (number == std::floor(number) && std::fabs(number) < 9007199254740992.0)
      out.value(static_cast<int64_t>(number));
    else // the shortest text that reads back to the same double (LLVM would print 17 digits)
      out.rawValue([&](llvm::raw_ostream &stream) { stream << fmt::format("{}", number); });
    return;
  }
  case JsonValue::Kind::string:
    out.value(value.asString());
    return;
  case JsonValue::Kind::array:
    out.array([&] {
      for (const JsonValue &item : value.asArray())
        writeValue(out, item);
    });
    return;
  case JsonValue::Kind::object:
    out.object([&] {
      for (const auto &[key, member] : value.asObject())
        out.attributeBegin(key), writeValue(out, member), out.attributeEnd();
    });
    return;
  }
}

} // namespace

bool JsonValue::asBool(std::string_view what) const {
  if (!isBool())
    wrongKind(what, "a boolean", kind());
  return std::get<bool>(value_);
}

double JsonValue::asNumber(std::string_view what) const {
  if (!isNumber())
    wrongKind(what, "a number", kind());
  return std::get<double>(value_);
}

std::int64_t JsonValue::asInteger(std::string_view what) const {
  double number = asNumber(what);
  if (number != std::floor(number) || std::fabs(number) >= 9007199254740992.0)
    throw JsonError(fmt::format("{}: expected an integer, found {}", what, number));
  return static_cast<std::int64_t>(number);
}

const std::string &JsonValue::asString(std::string_view what) const {
  if (!isString())
    wrongKind(what, "a string", kind());
  return std::get<std::string>(value_);
}

const JsonValue::Array &JsonValue::asArray(std::string_view what) const {
  if (!isArray())
    wrongKind(what, "an array", kind());
  return std::get<Array>(value_);
}

JsonValue::Array &JsonValue::asArray(std::string_view what) {
  if (!isArray())
    wrongKind(what, "an array", kind());
  return std::get<Array>(value_);
}

const JsonValue::Object &JsonValue::asObject(std::string_view what) const {
  if (!isObject())
    wrongKind(what, "an object", kind());
  return std::get<Object>(value_);
}

JsonValue::Object &JsonValue::asObject(std::string_view what) {
  if (!isObject())
    wrongKind(what, "an object", kind());
  return std::get<Object>(value_);
}

const JsonValue *JsonValue::find(std::string_view key) const {
  for (const auto &member : asObject())
    if (member.first == key)
      return &member.second;
  return nullptr;
}

JsonValue *JsonValue::find(std::string_view key) {
  for (auto &member : asObject())
    if (member.first == key)
      return &member.second;
  return nullptr;
}

const JsonValue &JsonValue::at(std::string_view key) const {
  if (const JsonValue *value = find(key))
    return *value;
  throw JsonError(fmt::format("missing key \"{}\"", key));
}

JsonValue &JsonValue::set(std::string_view key, JsonValue value) {
  if (JsonValue *existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  auto &members = asObject();
  members.emplace_back(std::string(key), std::move(value));
  return members.back().second;
}

JsonValue &JsonValue::push(JsonValue value) {
  auto &items = asArray();
  items.push_back(std::move(value));
  return items.back();
}

std::string_view nameOf(JsonValue::Kind kind) {
  switch (kind) {
  case JsonValue::Kind::null:
    return "null";
  case JsonValue::Kind::boolean:
    return "a boolean";
  case JsonValue::Kind::number:
    return "a number";
  case JsonValue::Kind::string:
    return "a string";
  case JsonValue::Kind::array:
    return "an array";
  case JsonValue::Kind::object:
    return "an object";
  }
  return "something else";
}

const JsonValue &requiredMember(const JsonValue &object, std::string_view key, const std::string &where) {
  const JsonValue *value = object.find(key);
  if (!value)
    throw JsonError(where + ": missing \"" + std::string(key) + "\"");
  return *value;
}

std::string requiredNonEmptyString(const JsonValue &object, std::string_view key, const std::string &where) {
  const std::string what = where + "." + std::string(key);
  const std::string &text = requiredMember(object, key, where).asString(what);
  if (text.empty())
    throw JsonError(what + ": must not be empty");
  return text;
}

std::filesystem::path requiredPath(const JsonValue &object, std::string_view key, const std::string &where) {
  std::string text = requiredNonEmptyString(object, key, where);
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw JsonError(
        fmt::format("{}.{}: expected a path without NUL characters, got \\u0000 at character {}", where, key, nul));
  return std::filesystem::path(std::move(text));
}

JsonValue parseJson(std::string_view text) {
  scanStructure(text, nullptr); // the depth limit, before LLVM's recursive parser
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(llvm::StringRef(text.data(), text.size()));
  if (!parsed)
    throw JsonError(parseErrorText(parsed.takeError()));
  KeyOrder order;
  scanStructure(text, &order);
  return Converter(text, std::move(order)).convert(*parsed);
}

std::string writeJson(const JsonValue &value, int indent) {
  std::string out;
  llvm::raw_string_ostream stream(out);
  {
    llvm::json::OStream writer(stream, static_cast<unsigned>(std::max(indent, 0)));
    writeValue(writer, value);
  }
  stream.flush();
  return out;
}

} // namespace sage::runtime
