// Per-layer preset choices: the selection rule and the JSON file.
#include "sage/runtime/LayerChoices.h"

#include "CacheFiles.h"

#include "sage/runtime/OutputPath.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace sage::runtime {
namespace {

constexpr std::string_view kFormat = "sagegen-layer-choices";
constexpr int kFormatVersion = 1;

double similarity(const JsonValue &object, std::string_view key, const std::string &where) {
  const std::string what = where + "." + std::string(key);
  const double value = requiredMember(object, key, where).asNumber(what);
  if (!std::isfinite(value))
    throw JsonError(what + ": expected a finite number");
  return value;
}

// Cosine similarities lie in [-1, 1]; a relative L1 error is a non-negative number.
double boundedSimilarity(const JsonValue &object, std::string_view key, const std::string &where, double low,
                         double high) {
  const double value = similarity(object, key, where);
  if (value < low || value > high)
    throw JsonError(fmt::format("{}.{}: expected a number in [{}, {}], got {}", where, key, low, high, value));
  return value;
}

// A preset name as sagegen spells them (sage-b, sage2-fp8, exact, ...).
std::string presetName(const JsonValue &object, std::string_view key, const std::string &where) {
  std::string name = requiredNonEmptyString(object, key, where);
  if (name.size() > 64 || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_.-") != std::string::npos)
    throw JsonError(
        fmt::format("{}.{}: expected a preset name (at most 64 of [a-z0-9_.-]), got \"{}\"", where, key, name));
  return name;
}

size_t rankIn(const std::vector<std::string> &order, const std::string &name) {
  return static_cast<size_t>(std::find(order.begin(), order.end(), name) - order.begin());
}

} // namespace

const LayerChoice *LayerChoices::find(std::string_view layer) const {
  for (const LayerChoice &choice : layers)
    if (choice.layer == layer)
      return &choice;
  return nullptr;
}

const std::string &LayerChoices::presetFor(std::string_view layer) const {
  if (const LayerChoice *choice = find(layer))
    return choice->preset;
  std::string known;
  for (const LayerChoice &choice : layers)
    known += (known.empty() ? "" : ", ") + choice.layer;
  throw std::out_of_range("layer choices: no layer '" + std::string(layer) + "' (the file has " +
                          (known.empty() ? std::string("none") : known) + ")");
}

const std::vector<std::string> &paperSpeedOrder() {
  static const std::vector<std::string> order = {"sage-vb", "sage-vt", "sage-b", "sage-t"};
  return order;
}

std::vector<std::string> paperOrdered(std::vector<std::string> candidates) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const std::string &a, const std::string &b) {
    return rankIn(paperSpeedOrder(), a) < rankIn(paperSpeedOrder(), b);
  });
  return candidates;
}

LayerChoice chooseLayerPreset(std::string layer, std::vector<CandidateAccuracy> candidates, const SelectionRule &rule) {
  LayerChoice choice;
  choice.layer = std::move(layer);
  choice.candidates = std::move(candidates);
  std::vector<const CandidateAccuracy *> passing;
  const CandidateAccuracy *most_accurate = nullptr;
  for (const CandidateAccuracy &candidate : choice.candidates) {
    if (candidate.cos_similarity >= rule.threshold)
      passing.push_back(&candidate);
    if (!most_accurate || candidate.cos_similarity > most_accurate->cos_similarity)
      most_accurate = &candidate;
  }
  if (!passing.empty()) {
    const CandidateAccuracy *fastest =
        *std::min_element(passing.begin(), passing.end(), [&](const CandidateAccuracy *a, const CandidateAccuracy *b) {
          return rankIn(rule.fastest_first, a->preset) < rankIn(rule.fastest_first, b->preset);
        });
    choice.preset = fastest->preset;
    choice.reason = fmt::format("the fastest of the {} candidate{} with cos >= {} ({:.6f})", passing.size(),
                                passing.size() == 1 ? "" : "s", rule.threshold, fastest->cos_similarity);
    return choice;
  }
  if (rule.fallback == SelectionFallback::most_accurate && most_accurate) {
    choice.preset = most_accurate->preset;
    choice.reason = fmt::format("no candidate reaches cos {}: the most accurate one ({:.6f})", rule.threshold,
                                most_accurate->cos_similarity);
  } else {
    choice.preset = "exact";
    choice.reason = most_accurate ? fmt::format("no candidate reaches cos {} (best: {} at {:.6f}): exact attention",
                                                rule.threshold, most_accurate->preset, most_accurate->cos_similarity)
                                  : std::string("no candidates: exact attention");
  }
  return choice;
}

JsonValue layerChoicesToJson(const LayerChoices &choices) {
  JsonValue json = JsonValue::object();
  json.set("format", kFormat);
  json.set("version", kFormatVersion);
  json.set("threshold", choices.threshold);
  json.set("speed_order", choices.speed_order);
  JsonValue layers = JsonValue::array();
  for (const LayerChoice &choice : choices.layers) {
    JsonValue layer(JsonValue::Object{{"layer", choice.layer}, {"preset", choice.preset}, {"reason", choice.reason}});
    JsonValue candidates = JsonValue::array();
    for (const CandidateAccuracy &candidate : choice.candidates) {
      JsonValue item(JsonValue::Object{{"preset", candidate.preset},
                                       {"cos_similarity", candidate.cos_similarity},
                                       {"relative_l1", candidate.relative_l1}});
      candidates.push(std::move(item));
    }
    layer.set("candidates", std::move(candidates));
    layers.push(std::move(layer));
  }
  json.set("layers", std::move(layers));
  return json;
}

LayerChoices layerChoicesFromJson(const JsonValue &json, std::string_view source) {
  try {
    json.asObject("the file");
    const JsonValue *format = json.find("format");
    if (!format || !format->isString() || format->asString() != kFormat)
      throw JsonError("\"format\": expected \"" + std::string(kFormat) + "\"");
    const int64_t version = requiredMember(json, "version", "the file").asInteger("version");
    if (version != kFormatVersion)
      throw JsonError(
          fmt::format("\"version\": this sagegen reads version {}, the file has {}", kFormatVersion, version));
    LayerChoices choices;
    choices.threshold = boundedSimilarity(json, "threshold", "the file", -1.0, 1.0);
    if (const JsonValue *order = json.find("speed_order"))
      choices.speed_order = order->asString("speed_order");
    const JsonValue::Array &layers = requiredMember(json, "layers", "the file").asArray("layers");
    std::set<std::string, std::less<>> layer_names; // duplicates found in O(n log n), not by a scan per layer
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string where = fmt::format("layers[{}]", i);
      layers[i].asObject(where);
      LayerChoice choice;
      choice.layer = requiredNonEmptyString(layers[i], "layer", where);
      choice.preset = presetName(layers[i], "preset", where);
      if (const JsonValue *reason = layers[i].find("reason"))
        choice.reason = reason->asString(where + ".reason");
      if (const JsonValue *candidates = layers[i].find("candidates")) {
        const JsonValue::Array &items = candidates->asArray(where + ".candidates");
        for (size_t c = 0; c < items.size(); ++c) {
          const std::string item_where = fmt::format("{}.candidates[{}]", where, c);
          items[c].asObject(item_where);
          choice.candidates.push_back({presetName(items[c], "preset", item_where),
                                       boundedSimilarity(items[c], "cos_similarity", item_where, -1.0, 1.0),
                                       boundedSimilarity(items[c], "relative_l1", item_where, 0.0, 1e300)});
        }
      }
      const bool listed = std::any_of(choice.candidates.begin(), choice.candidates.end(),
                                      [&](const CandidateAccuracy &c) { return c.preset == choice.preset; });
      if (choice.preset != "exact" && !choice.candidates.empty() && !listed)
        throw JsonError(where + ".preset: \"" + choice.preset + "\" is neither \"exact\" nor one of the candidates");
      if (!layer_names.insert(choice.layer).second)
        throw JsonError(where + ".layer: \"" + choice.layer + "\" appears twice");
      choices.layers.push_back(std::move(choice));
    }
    return choices;
  } catch (const JsonError &error) {
    throw LayerChoicesError(std::string(source) + ": " + error.what());
  }
}

LayerChoices loadLayerChoices(const std::filesystem::path &path) {
  cache_files::ReadResult file = cache_files::readWholeFile(path);
  if (file.outcome == cache_files::ReadOutcome::missing)
    throw LayerChoicesError(path.string() + ": no such file");
  if (file.outcome == cache_files::ReadOutcome::failed)
    throw LayerChoicesError(path.string() + ": " + file.error);
  JsonValue json;
  try {
    json = parseJson(std::string_view(reinterpret_cast<const char *>(file.bytes.data()), file.bytes.size()));
  } catch (const JsonError &error) {
    throw LayerChoicesError(path.string() + ": " + error.what());
  }
  return layerChoicesFromJson(json, path.string());
}

void saveLayerChoices(const std::filesystem::path &path, const LayerChoices &choices) {
  // The path is the user's (select -o): replace a regular file only, never a device, FIFO, directory or link.
  if (std::optional<std::string> problem = outputPathProblem(path))
    throw LayerChoicesError(*problem);
  const std::string text = writeJson(layerChoicesToJson(choices)) + "\n";
  if (std::optional<std::string> error = cache_files::writeFileAtomically(path, bytesOf(text)))
    throw LayerChoicesError(*error); // names the path
}

} // namespace sage::runtime
