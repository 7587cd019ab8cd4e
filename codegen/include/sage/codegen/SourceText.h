// The one way a string from the IR or from a user (a variant's name) enters generated source (issue 26).
#pragma once

#include <string>
#include <string_view>

namespace sage::codegen {

// `text` with every byte outside [A-Za-z0-9_.-] written as %XX (two upper-case hex digits; '%' itself too). The
// result cannot end a comment or a line, splice lines, start a directive, close a string literal or form a trigraph,
// so it may stand in // and /* */ comments and string literals, and kernel names are derived from it. The IR's
// verifier admits only those characters in program names (sage/ir/OpTraits.h), so a verified name comes out as it
// went in; a variant built without the IR (its name set directly) is escaped.
std::string sourceSafe(std::string_view text);

} // namespace sage::codegen
