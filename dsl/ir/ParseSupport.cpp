#include "ParseSupport.h"

#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>

#include "mlir/IR/BuiltinAttributes.h"

namespace sage::ir::detail {

std::string locationText(mlir::Location location) {
  if (auto file = mlir::dyn_cast<mlir::FileLineColLoc>(location))
    return (file.getFilename().str() + ":" + std::to_string(file.getLine()) + ":" + std::to_string(file.getColumn()));
  if (auto named = mlir::dyn_cast<mlir::NameLoc>(location))
    return named.getName().str();
  if (auto fused = mlir::dyn_cast<mlir::FusedLoc>(location))
    for (mlir::Location inner : fused.getLocations())
      if (std::string text = locationText(inner); !text.empty())
        return text;
  return "";
}

// MLIR's parser recurses once per nested bracket, so a few thousand of them overflow the stack: bound the nesting
// (and the size) before MLIR sees the text. Closers pop only their own opener, so the count is never below the
// parser's real depth; strings and comments are skipped. Limits: Program.h.
std::vector<Diagnostic> checkParserInput(std::string_view text, std::string_view source_name) {
  if (text.size() > kMaxProgramBytes)
    return {{std::string(source_name), "a sage program is at most " + std::to_string(kMaxProgramBytes) +
                                           " bytes, got " + std::to_string(text.size())}};
  std::string open;
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\0') // MLIR's lexer takes a NUL for the end of its buffer: one inside it desynchronizes the parser
      return {{std::string(source_name) + ":" + std::to_string(line) + ":" + std::to_string(i - line_start + 1),
               "a NUL byte: a sage program is text"}};
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    } else if (c == '"') { // skip to the closing quote; a newline ends the (bad) string so lines stay counted
      while (i + 1 < text.size() && text[i + 1] != '"' && text[i + 1] != '\n')
        i += (text[i + 1] == '\\' && i + 2 < text.size() && text[i + 2] != '\n') ? 2 : 1;
      if (i + 1 < text.size() && text[i + 1] == '"')
        ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i + 1 < text.size() && text[i + 1] != '\n')
        ++i;
    } else if (c == '(' || c == '[' || c == '{' || c == '<') {
      open.push_back(c);
      if (open.size() > kMaxNesting)
        return {{std::string(source_name) + ":" + std::to_string(line) + ":" + std::to_string(i - line_start + 1),
                 "brackets nest deeper than " + std::to_string(kMaxNesting) + " levels"}};
    } else if (!open.empty() && ((c == ')' && open.back() == '(') || (c == ']' && open.back() == '[') ||
                                 (c == '}' && open.back() == '{') || (c == '>' && open.back() == '<'))) {
      open.pop_back();
    }
  }
  return {};
}

mlir::OwningOpRef<mlir::ModuleOp> parseModule(mlir::MLIRContext &context, std::string_view text,
                                              std::string_view source_name, std::string_view what) {
  if (auto problems = checkParserInput(text, source_name); !problems.empty())
    throw ProgramError(std::move(problems));
  DiagnosticCollector collector(context);
  mlir::ParserConfig config(&context, /*verifyAfterParse=*/true);
  // The lexer reads the NUL after the last byte to find the end: a string_view (from the C ABI, say) need not have
  // one, so parse a NUL-terminated copy.
  const std::string terminated(text);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(llvm::StringRef(terminated.c_str(), terminated.size()), config,
                                              llvm::StringRef(source_name.data(), source_name.size()));
  std::vector<Diagnostic> diagnostics = collector.take();
  if (!module)
    throw ProgramError(diagnostics.empty() ? std::vector<Diagnostic>{{"", "could not parse the " + std::string(what)}}
                                           : std::move(diagnostics));
  return module;
}

std::string printedText(mlir::Operation *operation) {
  std::string text;
  llvm::raw_string_ostream stream(text);
  operation->print(stream);
  stream << "\n";
  return text;
}

std::string fingerprintOf(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 0x100000001b3ull;
  }
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(hash));
  return digits;
}

} // namespace sage::ir::detail
