// A schedule's answer to "can you run this variant here?", with the reason when it cannot.
#pragma once

#include <string>

namespace sage::schedules {

struct SupportResult {
  bool supported = false;
  std::string reason; // empty when supported; otherwise one sentence naming what is missing

  static SupportResult yes() { return {true, {}}; }
  static SupportResult no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return supported; }
};

} // namespace sage::schedules
