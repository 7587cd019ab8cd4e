#include "sage/runtime/Json.h"

#include <fmt/core.h>

#include <cmath>
#include <cstdlib>

namespace sage::runtime {
namespace {

[[noreturn]] void wrongKind(std::string_view what, const char *expected, JsonValue::Kind actual) {
  throw JsonError(fmt::format("{}: expected {}, found {}", what, expected, nameOf(actual)));
}

// Recursive-descent parser over the whole text, tracking line and column for messages.
class Parser {
public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue parseDocument() {
    JsonValue value = parseValue(0);
    skipSpace();
    if (position_ != text_.size())
      fail("unexpected text after the JSON value");
    return value;
  }

private:
  static constexpr int max_depth = 256;

  [[noreturn]] void fail(std::string_view message) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < position_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw JsonError(fmt::format("line {}, column {}: {}", line, column, message));
  }

  void skipSpace() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t' ||
                                        text_[position_] == '\n' || text_[position_] == '\r'))
      ++position_;
  }

  bool consume(char expected) {
    skipSpace();
    if (position_ < text_.size() && text_[position_] == expected) {
      ++position_;
      return true;
    }
    return false;
  }

  void expect(char expected) {
    if (!consume(expected))
      fail(fmt::format("expected '{}'", expected));
  }

  void expectWord(std::string_view word) {
    if (text_.substr(position_, word.size()) != word)
      fail(fmt::format("expected '{}'", word));
    position_ += word.size();
  }

  JsonValue parseValue(int depth) {
    if (depth > max_depth)
      fail("nesting deeper than 256 levels");
    skipSpace();
    if (position_ >= text_.size())
      fail("unexpected end of text, expected a value");
    char c = text_[position_];
    switch (c) {
    case '{':
      return parseObject(depth);
    case '[':
      return parseArray(depth);
    case '"':
      return JsonValue(parseString());
    case 't':
      expectWord("true");
      return JsonValue(true);
    case 'f':
      expectWord("false");
      return JsonValue(false);
    case 'n':
      expectWord("null");
      return JsonValue(nullptr);
    default:
      if (c == '-' || (c >= '0' && c <= '9'))
        return JsonValue(parseNumber());
      fail(fmt::format("unexpected character '{}'", c));
    }
  }

  JsonValue parseObject(int depth) {
    ++position_; // '{'
    JsonValue::Object members;
    if (consume('}'))
      return JsonValue(std::move(members));
    do {
      skipSpace();
      if (position_ >= text_.size() || text_[position_] != '"')
        fail("expected a string key");
      std::string key = parseString();
      for (const auto &member : members)
        if (member.first == key)
          fail(fmt::format("duplicate key \"{}\"", key));
      expect(':');
      members.emplace_back(std::move(key), parseValue(depth + 1));
    } while (consume(','));
    expect('}');
    return JsonValue(std::move(members));
  }

  JsonValue parseArray(int depth) {
    ++position_; // '['
    JsonValue::Array items;
    if (consume(']'))
      return JsonValue(std::move(items));
    do {
      items.push_back(parseValue(depth + 1));
    } while (consume(','));
    expect(']');
    return JsonValue(std::move(items));
  }

  unsigned parseHex4() {
    if (position_ + 4 > text_.size())
      fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[position_++];
      code <<= 4;
      if (h >= '0' && h <= '9')
        code |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f')
        code |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        code |= unsigned(h - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return code;
  }

  static void appendUtf8(std::string &out, unsigned code) {
    if (code < 0x80) {
      out += char(code);
    } else if (code < 0x800) {
      out += char(0xC0 | (code >> 6));
      out += char(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += char(0xE0 | (code >> 12));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    } else {
      out += char(0xF0 | (code >> 18));
      out += char(0x80 | ((code >> 12) & 0x3F));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    }
  }

  std::string parseString() {
    ++position_; // opening quote
    std::string out;
    while (true) {
      if (position_ >= text_.size())
        fail("unterminated string");
      char c = text_[position_++];
      if (c == '"')
        return out;
      if (static_cast<unsigned char>(c) < 0x20)
        fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (position_ >= text_.size())
        fail("unterminated escape");
      char e = text_[position_++];
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        unsigned code = parseHex4();
        if (code >= 0xD800 && code < 0xDC00) { // a surrogate pair
          if (text_.substr(position_, 2) != "\\u")
            fail("unpaired surrogate in \\u escape");
          position_ += 2;
          unsigned low = parseHex4();
          if (low < 0xDC00 || low >= 0xE000)
            fail("bad low surrogate in \\u escape");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        appendUtf8(out, code);
        break;
      }
      default:
        fail(fmt::format("unknown escape '\\{}'", e));
      }
    }
  }

  double parseNumber() {
    size_t start = position_;
    auto digits = [&] {
      size_t first = position_;
      while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9')
        ++position_;
      return position_ - first;
    };
    if (text_[position_] == '-')
      ++position_;
    if (position_ < text_.size() && text_[position_] == '0')
      ++position_;
    else if (digits() == 0)
      fail("expected digits");
    if (position_ < text_.size() && text_[position_] == '.') {
      ++position_;
      if (digits() == 0)
        fail("expected digits after '.'");
    }
    if (position_ < text_.size() && (text_[position_] == 'e' || text_[position_] == 'E')) {
      ++position_;
      if (position_ < text_.size() && (text_[position_] == '+' || text_[position_] == '-'))
        ++position_;
      if (digits() == 0)
        fail("expected exponent digits");
    }
    std::string number(text_.substr(start, position_ - start));
    return std::strtod(number.c_str(), nullptr);
  }

  std::string_view text_;
  size_t position_ = 0;
};

void writeString(std::string &out, const std::string &text) {
  out += '"';
  for (char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20)
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else
        out += c;
    }
  }
  out += '"';
}

void writeNumber(std::string &out, double number) {
  if (!std::isfinite(number))
    throw JsonError("cannot write a non-finite number as JSON");
  if (number == std::floor(number) && std::fabs(number) < 9007199254740992.0)
    out += fmt::format("{}", static_cast<long long>(number));
  else
    out += fmt::format("{}", number); // shortest text that reads back to the same double
}

void writeValue(std::string &out, const JsonValue &value, int indent, int level) {
  auto newline = [&](int at_level) {
    if (indent > 0) {
      out += '\n';
      out.append(size_t(indent * at_level), ' ');
    }
  };
  switch (value.kind()) {
  case JsonValue::Kind::null:
    out += "null";
    return;
  case JsonValue::Kind::boolean:
    out += value.asBool() ? "true" : "false";
    return;
  case JsonValue::Kind::number:
    writeNumber(out, value.asNumber());
    return;
  case JsonValue::Kind::string:
    writeString(out, value.asString());
    return;
  case JsonValue::Kind::array: {
    const auto &items = value.asArray();
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out += indent > 0 ? "," : ", ";
      newline(level + 1);
      writeValue(out, items[i], indent, level + 1);
    }
    newline(level);
    out += ']';
    return;
  }
  case JsonValue::Kind::object: {
    const auto &members = value.asObject();
    if (members.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t i = 0; i < members.size(); ++i) {
      if (i)
        out += indent > 0 ? "," : ", ";
      newline(level + 1);
      writeString(out, members[i].first);
      out += ": ";
      writeValue(out, members[i].second, indent, level + 1);
    }
    newline(level);
    out += '}';
    return;
  }
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

JsonValue parseJson(std::string_view text) { return Parser(text).parseDocument(); }

std::string writeJson(const JsonValue &value, int indent) {
  std::string out;
  writeValue(out, value, indent, 0);
  return out;
}

} // namespace sage::runtime
