// The per-layer preset choice of `sagegen select` (SageAttention, section 4.5: per layer, the fastest kernel whose
// cosine similarity to exact attention on sample inputs reaches a threshold), and its JSON file, which applications
// load to pick the preset of each attention layer:
//
//   {"format": "sagegen-layer-choices", "version": 1, "threshold": 0.998, "speed_order": "...",
//    "layers": [{"layer": "blocks.0", "preset": "sage-vb", "reason": "...",
//                "candidates": [{"preset": "sage-vb", "cos_similarity": 0.9993, "relative_l1": 0.031}, ...]}, ...]}
#pragma once

#include "sage/runtime/Json.h"

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

// A malformed layer-choices file: the message names the file and the JSON position or field.
class LayerChoicesError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct CandidateAccuracy {
  std::string preset;
  double cos_similarity = 0.0; // against exact attention on the layer's samples
  double relative_l1 = 0.0;
};

struct LayerChoice {
  std::string layer;
  std::string preset; // what to run this layer with
  std::string reason; // why, in one sentence
  std::vector<CandidateAccuracy> candidates;
};

struct LayerChoices {
  double threshold = 0.998;
  std::string speed_order; // where "fastest" came from: the tuning database or the paper's order
  std::vector<LayerChoice> layers;

  // The choice for `layer`, or null.
  const LayerChoice *find(std::string_view layer) const;
  // The preset for `layer`; std::out_of_range naming the layer and the known ones when it is not in the file.
  const std::string &presetFor(std::string_view layer) const;
};

enum class SelectionFallback { exact, most_accurate }; // when no candidate reaches the threshold

struct SelectionRule {
  double threshold = 0.998;               // the paper's 99.8%: SageAttn-B's worst layer
  std::vector<std::string> fastest_first; // the candidates' speed order
  SelectionFallback fallback = SelectionFallback::exact;
};

// The fastest candidate (in rule.fastest_first order) whose cosine similarity is >= the threshold; otherwise the
// fallback ("exact", or the most accurate candidate). Candidates missing from the speed order rank after it.
LayerChoice chooseLayerPreset(std::string layer, std::vector<CandidateAccuracy> candidates, const SelectionRule &rule);

// The SageAttention paper's speed order of its four kernels (Table 6, section 4.5): 8-bit P.V is faster than FP16
// P.V (vB is about 4% faster than B) and per-block Q/K scales are cheaper than per-token ones: vB, vT, B, T.
const std::vector<std::string> &paperSpeedOrder();
// `candidates` sorted by the paper's order (unknown presets keep their relative order, after the known ones).
std::vector<std::string> paperOrdered(std::vector<std::string> candidates);

JsonValue layerChoicesToJson(const LayerChoices &choices);
// `source` names the file in messages. Checks the format, version, types, a non-empty preset per layer that is
// "exact" or one of the layer's candidates, and unique layer names.
LayerChoices layerChoicesFromJson(const JsonValue &json, std::string_view source);
// Throws LayerChoicesError (unreadable file, JSON errors with line and column, schema errors naming the field).
LayerChoices loadLayerChoices(const std::filesystem::path &path);
// Writes atomically (temporary file + rename in the same directory) over a regular file or to a new path; anything
// else at `path` is refused by name (OutputPath.h). Throws LayerChoicesError.
void saveLayerChoices(const std::filesystem::path &path, const LayerChoices &choices);

} // namespace sage::runtime
