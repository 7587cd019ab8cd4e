#include "sage/runtime/KernelKey.h"

#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

#include <charconv>
#include <utility>

#ifndef SAGEGEN_VERSION
#define SAGEGEN_VERSION "unknown"
#endif

namespace sage::runtime {
namespace {

void appendField(std::string &text, std::string_view name, std::string_view value) {
  text += name;
  text += '=';
  for (char character : value) {
    if (character == '\\')
      text += "\\\\";
    else if (character == '\n')
      text += "\\n";
    else
      text += character;
  }
  text += '\n';
}

// Reads "name=value\n" at `position`, unescaping the value; nullopt when the line is not that field.
std::optional<std::string> readField(std::string_view text, size_t &position, std::string_view name) {
  size_t end = text.find('\n', position);
  if (end == std::string_view::npos)
    return std::nullopt;
  std::string_view line = text.substr(position, end - position);
  if (!line.starts_with(name) || line.size() <= name.size() || line[name.size()] != '=')
    return std::nullopt;
  std::string value;
  for (size_t index = name.size() + 1; index < line.size(); ++index) {
    if (line[index] != '\\') {
      value += line[index];
      continue;
    }
    if (++index == line.size())
      return std::nullopt;
    if (line[index] == '\\')
      value += '\\';
    else if (line[index] == 'n')
      value += '\n';
    else
      return std::nullopt;
  }
  position = end + 1;
  return value;
}

} // namespace

std::string KernelKey::text() const {
  std::string text = fmt::format("sagegen-kernel-key {}\n", kKernelKeyFormatVersion);
  appendField(text, "ir_hash", ir_hash);
  appendField(text, "schedule", schedule);
  appendField(text, "tunables", tunables);
  appendField(text, "head_dim", std::to_string(head_dim));
  appendField(text, "causal", causal ? "1" : "0");
  appendField(text, "dtypes", dtypes);
  appendField(text, "layout", layout);
  appendField(text, "arch", arch);
  appendField(text, "compiler_version", compiler_version);
  appendField(text, "sagegen_version", sagegen_version);
  appendField(text, "extra", extra);
  return text;
}

std::optional<KernelKey> parseKernelKeyText(std::string_view text) {
  const std::string header = fmt::format("sagegen-kernel-key {}\n", kKernelKeyFormatVersion);
  if (!text.starts_with(header))
    return std::nullopt;
  size_t position = header.size();
  KernelKey key;
  std::string head_dim, causal;
  for (auto [name, value] : {std::pair<std::string_view, std::string *>{"ir_hash", &key.ir_hash},
                             {"schedule", &key.schedule},
                             {"tunables", &key.tunables},
                             {"head_dim", &head_dim},
                             {"causal", &causal},
                             {"dtypes", &key.dtypes},
                             {"layout", &key.layout},
                             {"arch", &key.arch},
                             {"compiler_version", &key.compiler_version},
                             {"sagegen_version", &key.sagegen_version},
                             {"extra", &key.extra}}) {
    std::optional<std::string> field = readField(text, position, name);
    if (!field)
      return std::nullopt;
    *value = std::move(*field);
  }
  if (position != text.size() || (causal != "0" && causal != "1"))
    return std::nullopt;
  key.causal = causal == "1";
  auto [end, error] = std::from_chars(head_dim.data(), head_dim.data() + head_dim.size(), key.head_dim);
  if (error != std::errc() || end != head_dim.data() + head_dim.size() || head_dim.empty())
    return std::nullopt;
  // Only canonical texts: anything else would parse to a key whose text differs from the input.
  if (key.text() != text)
    return std::nullopt;
  return key;
}

std::string KernelKey::digest() const { return sha256Hex(text()); }

const char *sagegenVersion() { return SAGEGEN_VERSION; }

} // namespace sage::runtime
