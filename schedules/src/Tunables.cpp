#include "sage/schedules/Tunables.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace sage::schedules {

Tunables defaultTunables(const AttentionVariant &variant) {
  const bool causal = variant.mask.kind == MaskKind::causal;
  Tunables tunables;
  tunables.block_q = variant.block_q;
  tunables.block_kv = variant.block_kv;
  if (variant.head_dim <= 64) {
    tunables.warps = 4;
    tunables.stages = causal ? 4 : 3;
  } else {
    tunables.warps = 8;
    tunables.stages = causal ? 5 : 3;
  }
  // Below d = 64: 16 rows per warp (sage2-fp8 d32 with 32 rows per warp spilled 44 bytes on sm_90a, none with 16)
  if (variant.head_dim < 64)
    tunables.warps = 8;
  // Beyond d = 128: 4 warps of 16 rows and 32-token KV blocks keep S (and 8-bit P.V's block product) small enough
  // beside O_i's d / 2 f32 registers per thread, and Q_i with two stages of K_j and V_j within the 99 KiB of shared
  // memory of sm_86/sm_89 (d = 256, 16-bit Q/K: 32 KiB + 2 x 32 KiB).
  if (variant.head_dim > 128) {
    tunables.warps = 4;
    tunables.block_q = std::min(variant.block_q, 64);
    tunables.block_kv = std::min(variant.block_kv, 32);
  }
  return tunables;
}

Tunables defaultTunables(const AttentionVariant &variant, GpuArch arch) {
  Tunables tunables = defaultTunables(variant);
  // Measured on an H100 (bench/attention_bench.py, 2026-11-23), d128: 4 warps x 32 rows and a 2-stage pipeline beat
  // Table 12's 8 warps / 3 (5 causal) stages by 5-25% for sage-b and sage-t (f16 P.V) and 10-20% for sage-vb and
  // sage-vt (int8 P.V) at N = 1k..32k, causal or not; e4m3 P.V (sage2-fp8) ran ~35% slower that way. Only sm_90a was
  // measured: on sm_80 and sm_89 ptxas spills up to 400 bytes for sage-vt in this shape, so other archs keep Table 12's
  // row. Only d128 was measured: at d80/d96 this shape spilled 60-68 bytes (sage-b, sage-vb; ptxas, sm_90a).
  const bool measured_four_warps =
      arch == GpuArch::sm90a && variant.head_dim == 128 && isInteger(variant.qk.a) && variant.pv.a != ElementType::e4m3;
  if (measured_four_warps) {
    tunables.warps = 4;
    tunables.stages = 2;
  }
  return tunables;
}

std::string tunablesText(const Tunables &tunables) {
  return "block_q=" + std::to_string(tunables.block_q) + ",block_kv=" + std::to_string(tunables.block_kv) +
         ",warps=" + std::to_string(tunables.warps) + ",stages=" + std::to_string(tunables.stages) +
         (tunables.inline_loads ? ",inline_loads=1" : "") +
         (tunables.ctas != 0 ? ",ctas=" + std::to_string(tunables.ctas) : "");
}

Tunables parseTunables(std::string_view text, const Tunables &base) {
  Tunables tunables = base;
  std::string seen; // each name once: "warps=4,warps=8" is a mistake, not a choice of the last
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty())
      continue;
    size_t equals = item.find('=');
    if (equals == std::string_view::npos)
      throw std::invalid_argument("tunables: expected name=value, got '" + std::string(item) + "'");
    std::string_view name = item.substr(0, equals), value_text = item.substr(equals + 1);
    if (seen.find("," + std::string(name) + ",") != std::string::npos)
      throw std::invalid_argument("tunables: " + std::string(name) + " is given twice");
    seen += "," + std::string(name) + ",";
    int value = 0;
    auto [end, error] = std::from_chars(value_text.data(), value_text.data() + value_text.size(), value);
    const bool parsed = error == std::errc() && end == value_text.data() + value_text.size();
    if (name == "inline_loads") {
      if (!parsed || (value != 0 && value != 1))
        throw std::invalid_argument("tunables: inline_loads expects 0 or 1, got '" + std::string(value_text) + "'");
      tunables.inline_loads = value == 1;
      continue;
    }
    if (!parsed || value <= 0)
      throw std::invalid_argument("tunables: " + std::string(name) + " expects a positive integer, got '" +
                                  std::string(value_text) + "'");
    if (name == "block_q")
      tunables.block_q = value;
    else if (name == "block_kv")
      tunables.block_kv = value;
    else if (name == "warps")
      tunables.warps = value;
    else if (name == "stages")
      tunables.stages = value;
    else if (name == "ctas")
      tunables.ctas = value;
    else
      throw std::invalid_argument("tunables: unknown name '" + std::string(name) +
                                  "' (expected block_q, block_kv, warps, stages, inline_loads or ctas)");
  }
  return tunables;
}

} // namespace sage::schedules
