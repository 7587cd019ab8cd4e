// A caller's mistake in one named argument (a tensor, a field, an option): the message starts with the argument's
// name and says what was expected. The C ABI maps it to SAGE_INVALID_ARGUMENT by its type.
#pragma once

#include <stdexcept>
#include <string>

namespace sage::runtime {

class ArgumentError : public std::invalid_argument {
public:
  ArgumentError(const std::string &argument, const std::string &expectation)
      : std::invalid_argument(argument + ": " + expectation), argument_(argument) {}
  const std::string &argument() const { return argument_; }

private:
  std::string argument_;
};

} // namespace sage::runtime
