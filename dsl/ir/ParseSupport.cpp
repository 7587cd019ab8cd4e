#include "ParseSupport.h"

#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <unordered_map>

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

namespace {

// Where byte `offset` of `text` lies, as "name:line:column" (1-based, columns in bytes, as MLIR counts them).
std::string positionOf(std::string_view text, size_t offset, std::string_view source_name) {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  return std::string(source_name) + ":" + std::to_string(line) + ":" + std::to_string(offset - line_start + 1);
}

bool isValueNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '$' || c == '.' || c == '_' || c == '-';
}
bool isValueNameChar(char c) { return isValueNameStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

// The tokens the value check needs: SSA names (%x), ':', ',', '=' and everything else as `other`.
struct Token {
  enum Kind { value, colon, comma, equal, other } kind;
  size_t begin = 0, end = 0; // [begin, end) in the text; a value's name includes its '%'
};

} // namespace

// Checked before MLIR's parser sees untrusted text (limits: Program.h):
// - MLIR's parser recurses once per nested bracket, so a few thousand of them overflow the stack: bound the nesting
//   (and the size). Closers pop only their own opener, so the count is never below the parser's real depth.
// - Forward references. MLIR parses `%a = sage.dequant %b` before %b's definition by giving %a a placeholder operand
//   that the definition replaces later, wherever it lies: also inside the region of an op still being parsed. When
//   the text then fails to parse, that region is destroyed with the op defining %b while %a, already in the module,
//   still uses it, and destroying the module writes freed memory (valgrind: "Invalid write" in
//   Operation::dropAllReferences). A sage program never needs a forward reference (every operand is an earlier op's
//   result), so the text is refused if a value is used before its definition or defined twice (a definition in a
//   region that is closed again would let a later one resolve the placeholder): no placeholder is ever resolved.
//   A name counts as defined where it is followed by '=' or ':' (results, block arguments), or by ',' and another
//   such name; strings and comments are skipped as MLIR's lexer skips them. Reading too many names as definitions
//   only refuses more text; every definition MLIR makes is seen as one.
// - Properties in the generic syntax, `"sage.mask"(%s) <{kind = ...}> {kind = ...}`: the first silently wins (the
//   custom syntax's counterpart is refused by the parsers in Dialect.cpp).
std::vector<Diagnostic> checkParserInput(std::string_view text, std::string_view source_name) {
  if (text.size() > kMaxProgramBytes)
    return {{std::string(source_name), "a sage program is at most " + std::to_string(kMaxProgramBytes) +
                                           " bytes, got " + std::to_string(text.size())}};
  std::string open;
  std::vector<Token> tokens;
  const auto push = [&tokens](Token::Kind kind, size_t begin, size_t end) {
    if (kind != Token::other || tokens.empty() || tokens.back().kind != Token::other) // only what follows a name counts
      tokens.push_back({kind, begin, end});
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') // MLIR's lexer takes a NUL for the end of its buffer: one inside it desynchronizes the parser
      return {{positionOf(text, i, source_name), "a NUL byte: a sage program is text"}};
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
      continue;
    if (c == '"') { // to the closing quote; MLIR ends a (bad) string at a newline, \v or \f
      const size_t begin = i;
      while (i + 1 < text.size() && text[i + 1] != '"' && text[i + 1] != '\n' && text[i + 1] != '\v' &&
             text[i + 1] != '\f')
        i += (text[i + 1] == '\\' && i + 2 < text.size() && text[i + 2] != '\n') ? 2 : 1;
      if (i + 1 < text.size() && text[i + 1] == '"')
        ++i;
      push(Token::other, begin, i + 1);
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') { // MLIR ends a comment at \n or \r
      while (i + 1 < text.size() && text[i + 1] != '\n' && text[i + 1] != '\r')
        ++i;
    } else if (c == '%' && i + 1 < text.size() &&
               (std::isdigit(static_cast<unsigned char>(text[i + 1])) || isValueNameStart(text[i + 1]))) {
      // MLIR's lexer: '%' then digits, or a letter, $ . _ - and then letters, digits, $ . _ -
      const size_t begin = i;
      const bool numbered = std::isdigit(static_cast<unsigned char>(text[i + 1])) != 0;
      ++i;
      while (i + 1 < text.size() &&
             (numbered ? std::isdigit(static_cast<unsigned char>(text[i + 1])) != 0 : isValueNameChar(text[i + 1])))
        ++i;
      push(Token::value, begin, i + 1);
    } else {
      push(c == ':' ? Token::colon : c == ',' ? Token::comma : c == '=' ? Token::equal : Token::other, i, i + 1);
      if (c == '<') { // MLIR's generic syntax gives properties as <{...}> beside the attribute dictionary {...}
        size_t next = i + 1;
        while (next < text.size() &&
               (text[next] == ' ' || text[next] == '\t' || text[next] == '\n' || text[next] == '\r'))
          ++next;
        if (next < text.size() && text[next] == '{')
          return {{positionOf(text, i, source_name),
                   "properties '<{...}>' (MLIR's generic syntax) beside an attribute dictionary could say two things "
                   "of one attribute: write the op in its own syntax, as `sagegen ir` prints it"}};
      }
      if (c == '(' || c == '[' || c == '{' || c == '<') {
        open.push_back(c);
        if (open.size() > kMaxNesting)
          return {{positionOf(text, i, source_name),
                   "brackets nest deeper than " + std::to_string(kMaxNesting) + " levels"}};
      } else if (!open.empty() && ((c == ')' && open.back() == '(') || (c == ']' && open.back() == '[') ||
                                   (c == '}' && open.back() == '{') || (c == '>' && open.back() == '<'))) {
        open.pop_back();
      }
    }
  }

  // Which names are definitions, from the last token back (a list `%a, %b:2, %c =` is decided by its end).
  std::vector<bool> defines(tokens.size(), false);
  for (size_t t = tokens.size(); t-- > 0;) {
    if (tokens[t].kind != Token::value || t + 1 == tokens.size())
      continue;
    const Token::Kind next = tokens[t + 1].kind;
    defines[t] =
        next == Token::colon || next == Token::equal ||
        (next == Token::comma && t + 2 < tokens.size() && tokens[t + 2].kind == Token::value && defines[t + 2]);
  }
  std::unordered_map<std::string_view, size_t> defined, first_use; // name -> offset
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t].kind != Token::value)
      continue;
    const std::string_view name = text.substr(tokens[t].begin, tokens[t].end - tokens[t].begin);
    if (!defines[t]) {
      first_use.try_emplace(name, tokens[t].begin);
      continue;
    }
    if (auto earlier = defined.find(name); earlier != defined.end())
      return {{positionOf(text, tokens[t].begin, source_name),
               std::string(name) + " is defined a second time (first at " +
                   positionOf(text, earlier->second, source_name) +
                   "): a file holds one sage program, and each of its values has one name"}};
    if (auto use = first_use.find(name); use != first_use.end())
      return {{positionOf(text, use->second, source_name),
               std::string(name) + " is used before its definition (at " +
                   positionOf(text, tokens[t].begin, source_name) +
                   "): every operand of a sage program is the result of an earlier op"}};
    defined.emplace(name, tokens[t].begin);
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
