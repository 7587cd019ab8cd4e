#include "sage/ir/BackwardVariant.h"

namespace sage {

std::string_view nameOf(BackwardProduct product) {
  switch (product) {
  case BackwardProduct::s:
    return "s";
  case BackwardProduct::dp:
    return "dp";
  case BackwardProduct::dv:
    return "dv";
  case BackwardProduct::dq:
    return "dq";
  case BackwardProduct::dk:
    return "dk";
  }
  return "?";
}

} // namespace sage
