// libFuzzer target: the tunables parser (sage::schedules::parseTunables). Property: accepted tunables, written with
// tunablesText, parse back to the same values.
#include "sage/schedules/Tunables.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace sage::schedules;
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  try {
    const Tunables tunables = parseTunables(text, Tunables{});
    const Tunables again = parseTunables(tunablesText(tunables), Tunables{});
    if (again.block_q != tunables.block_q || again.block_kv != tunables.block_kv || again.warps != tunables.warps ||
        again.stages != tunables.stages)
      std::abort();
  } catch (const std::invalid_argument &) {
  }
  return 0;
}
