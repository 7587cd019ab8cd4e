#include "sage/runtime/KernelKey.h"

#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

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

std::string KernelKey::digest() const { return sha256Hex(text()); }

const char *sagegenVersion() { return SAGEGEN_VERSION; }

} // namespace sage::runtime
