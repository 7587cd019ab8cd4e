// `sagegen select`: the adaptive per-layer choice of SageAttention (section 4.5). For each layer's sample Q/K/V, the
// CPU reference (bit-exact with the GPU kernels' quantizers) measures every candidate preset against exact
// attention; the fastest candidate reaching the threshold is chosen, and the choices are written as JSON for
// runtime::loadLayerChoices.
//
// Samples: a directory of `<layer>.q.npy`, `<layer>.k.npy`, `<layer>.v.npy` (layers in name order), or a JSON file
// listing them: [{"layer": "blocks.0", "q": "q0.npy", "k": "k0.npy", "v": "v0.npy"}, ...] (paths relative to the
// JSON file). Each .npy is little-endian float16 or float32, C order, [heads, tokens, head_dim] or
// [batch, heads, tokens, head_dim].
#include "KernelSetOptions.h"

#include "sage/numerics/CheckedSize.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/NpyFile.h"
#include "sage/reference/Reference.h"
#include "sage/reference/RegularFile.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/Json.h"
#include "sage/runtime/LayerChoices.h"
#include "sage/runtime/OutputPath.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/schedules/GpuArch.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>

namespace sage::tool {
namespace {

namespace fs = std::filesystem;

struct SelectOptions {
  std::string samples;
  std::vector<std::string> candidates = {"sage-vb", "sage-vt", "sage-b", "sage-t"};
  double threshold = 0.998;
  bool causal = false;
  std::string fallback = "exact";
  std::string output = "layer_choices.json";
  std::string database;
  std::string input = "f16";
};

struct LayerFiles {
  std::string layer;
  fs::path q, k, v;
};

std::vector<LayerFiles> layersInDirectory(const fs::path &directory) {
  std::vector<LayerFiles> layers;
  const std::string suffix = ".q.npy";
  for (const fs::directory_entry &item : fs::directory_iterator(directory)) {
    const std::string name = item.path().filename().string();
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    LayerFiles files;
    files.layer = name.substr(0, name.size() - suffix.size());
    files.q = item.path();
    files.k = directory / (files.layer + ".k.npy");
    files.v = directory / (files.layer + ".v.npy");
    for (const fs::path &path : {files.k, files.v})
      if (!fs::exists(path))
        throw UserError("SAMPLES: layer '" + files.layer + "' has " + name + " but no " + path.filename().string());
    layers.push_back(std::move(files));
  }
  std::sort(layers.begin(), layers.end(), [](const LayerFiles &a, const LayerFiles &b) { return a.layer < b.layer; });
  if (layers.empty())
    throw UserError("SAMPLES: no <layer>.q.npy files in " + directory.string());
  return layers;
}

constexpr int64_t kMaxLayerListBytes = int64_t(16) << 20;

std::vector<LayerFiles> layersInList(const fs::path &list) {
  const std::string text = reference::readRegularFile(list.string(), kMaxLayerListBytes, "SAMPLES");
  std::vector<LayerFiles> layers;
  try {
    const runtime::JsonValue json = runtime::parseJson(text);
    const runtime::JsonValue::Array &items = json.asArray("the layer list");
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string where = fmt::format("[{}]", i);
      items[i].asObject(where);
      LayerFiles files;
      files.layer = items[i].at("layer").asString(where + ".layer");
      auto resolve = [&](const char *key) {
        const fs::path path = runtime::requiredPath(items[i], key, where); // a NUL would cut the path short
        return path.is_absolute() ? path : list.parent_path() / path;
      };
      files.q = resolve("q");
      files.k = resolve("k");
      files.v = resolve("v");
      if (files.layer.empty())
        throw runtime::JsonError(where + ".layer: must not be empty");
      // The choices file names each layer once (loadLayerChoices refuses a repeat): refuse it here, not after the work.
      for (size_t j = 0; j < layers.size(); ++j)
        if (layers[j].layer == files.layer)
          throw runtime::JsonError(fmt::format("{}.layer: \"{}\" is already the layer of [{}]", where, files.layer, j));
      layers.push_back(std::move(files));
    }
  } catch (const runtime::JsonError &error) {
    throw UserError("SAMPLES: " + list.string() + ": " + error.what());
  }
  if (layers.empty())
    throw UserError("SAMPLES: " + list.string() + " lists no layers");
  return layers;
}

// A sample, refused by name when a value is not finite (the reference would only report NaN metrics, which the choices
// file cannot hold).
reference::HostTensor load(const fs::path &path) {
  std::optional<reference::HostTensor> tensor;
  try {
    tensor.emplace(reference::loadNpyTensor(path.string()));
  } catch (const std::invalid_argument &error) {
    throw UserError(std::string("SAMPLES: ") + error.what());
  }
  const std::vector<float> &values = tensor->values();
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw UserError(fmt::format("SAMPLES: {}: expected finite values, got {} at element {} (in storage order)",
                                  path.string(), values[i], i));
  return std::move(*tensor);
}

struct LayerSamples {
  reference::HostTensor q, k, v;
};

LayerSamples loadLayer(const LayerFiles &files) {
  LayerSamples samples{load(files.q), load(files.k), load(files.v)};
  const reference::HostTensor &q = samples.q, &k = samples.k, &v = samples.v;
  if (q.dim() != k.dim() || q.dim() != v.dim() || k.tokens() != v.tokens() || k.heads() != v.heads() ||
      q.batch() != k.batch() || q.batch() != v.batch() || k.heads() == 0 || q.heads() % k.heads() != 0)
    throw UserError(fmt::format("SAMPLES: layer '{}': shapes do not fit together (q [{}, {}, {}, {}], k [{}, {}, "
                                "{}, {}], v [{}, {}, {}, {}]; expected one head_dim, K and V alike, q heads a "
                                "multiple of k heads)",
                                files.layer, q.batch(), q.heads(), q.tokens(), q.dim(), k.batch(), k.heads(),
                                k.tokens(), k.dim(), v.batch(), v.heads(), v.tokens(), v.dim()));
  try {
    reference::checkReferenceShape(q.batch(), q.heads(), k.heads(), q.tokens(), k.tokens(), q.dim());
  } catch (const std::invalid_argument &error) {
    throw UserError(fmt::format("SAMPLES: layer '{}' ({}): {}", files.layer, files.q.string(), error.what()));
  }
  return samples;
}

// The reference's compute limit (`sagegen reference` refuses one run past it) for the whole command: every layer runs
// exact attention and each candidate. Checked on every layer before any is computed, so that a large sample is refused
// at once rather than after minutes of work on the others.
void checkComputeLimit(const std::vector<LayerFiles> &layers, size_t candidates) {
  int64_t total = 0;
  for (const LayerFiles &files : layers) {
    const LayerSamples samples = loadLayer(files);
    const reference::HostTensor &q = samples.q, &k = samples.k;
    const std::optional<int64_t> work = numerics::checkedProduct(
        {q.batch(), q.heads(), q.tokens(), k.tokens(), q.dim(), 2, static_cast<int64_t>(candidates) + 1});
    if (!work || __builtin_add_overflow(total, *work, &total) || total > reference::kMaxReferenceWork)
      throw UserError(fmt::format(
          "SAMPLES: layer '{}' ({}) brings the CPU reference's work to {} multiply-adds (batch x heads x n_q x n_kv x "
          "d x 2, for exact attention and {} candidate{}, summed over the layers); the limit is 2^38 = {}, as for "
          "`sagegen reference`: give fewer or shorter samples, or fewer --candidates",
          files.layer, files.q.string(), work ? std::to_string(total) : std::string("more than 2^63"), candidates,
          candidates == 1 ? "" : "s", reference::kMaxReferenceWork));
  }
}

// An output that is not finite cannot be compared (and JSON cannot hold the NaN metrics): the values overflow.
void checkFinite(const std::vector<double> &output, const LayerFiles &files, std::string_view what) {
  for (double value : output)
    if (!std::isfinite(value))
      throw UserError(fmt::format("SAMPLES: layer '{}' ({}, {}, {}): {} is not finite on these values (they overflow "
                                  "its arithmetic); expected samples whose attention stays finite",
                                  files.layer, files.q.string(), files.k.string(), files.v.string(), what));
}

// The candidates from fastest to slowest: the tuning database's times for this GPU when it has every candidate at
// this (head dim, causal, input), at the N closest to the layer's; else the paper's order.
std::vector<std::string> speedOrder(const SelectOptions &options, const runtime::TuningDatabase &database,
                                    const std::optional<runtime::TuningDevice> &device, int head_dim, int64_t tokens,
                                    bool &from_database) {
  from_database = false;
  if (device && !database.empty()) {
    std::vector<std::pair<double, std::string>> timed;
    for (const std::string &preset : options.candidates) {
      runtime::TuningQuery query;
      query.device = *device;
      query.variant_names = {preset};
      query.head_dim = head_dim;
      query.causal = options.causal;
      query.input = options.input;
      query.tokens_hint = tokens;
      if (std::optional<runtime::TuningEntry> entry = database.lookup(query))
        timed.emplace_back(entry->milliseconds, preset);
    }
    if (timed.size() == options.candidates.size()) {
      std::stable_sort(timed.begin(), timed.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
      std::vector<std::string> order;
      for (const auto &[milliseconds, preset] : timed)
        order.push_back(preset);
      from_database = true;
      return order;
    }
  }
  return runtime::paperOrdered(options.candidates);
}

void select(const SelectOptions &options) {
  if (!(options.threshold > 0.0 && options.threshold <= 1.0))
    throw UserError("--threshold: expected a cosine similarity in (0, 1], got " + std::to_string(options.threshold));
  if (options.fallback != "exact" && options.fallback != "most-accurate")
    throw UserError("--fallback: expected exact or most-accurate, got '" + options.fallback + "'");
  parseInputOption(options.input); // validated here; the database compares the name
  if (options.candidates.empty())
    throw UserError("--candidates: name at least one preset");
  const fs::path samples = options.samples;
  if (!fs::exists(samples))
    throw UserError("SAMPLES: no such file or directory: " + samples.string());
  const std::vector<LayerFiles> layers = fs::is_directory(samples) ? layersInDirectory(samples) : layersInList(samples);
  // Where the choices go, before any work: a regular file or a new path only.
  if (std::optional<std::string> problem = runtime::outputPathProblem(options.output))
    throw UserError("--output: " + *problem);
  checkComputeLimit(layers, options.candidates.size());

  runtime::TuningDatabase database;
  std::optional<runtime::TuningDevice> device;
  const fs::path database_path =
      options.database.empty() ? runtime::TuningDatabase::defaultPath() : std::filesystem::path(options.database);
  try {
    database = runtime::TuningDatabase::read(database_path);
  } catch (const runtime::TuningDatabaseError &error) {
    if (!options.database.empty())
      throw UserError(std::string("--db: ") + error.what());
    fmt::print(stderr, "sagegen: warning: ignoring the tuning database: {}\n", error.what());
  }
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  if (!database.empty() && driver.available())
    device = runtime::currentTuningDevice(std::string(schedules::archName(runtime::currentDeviceArch())));

  runtime::LayerChoices choices;
  choices.threshold = options.threshold;
  runtime::SelectionRule rule;
  rule.threshold = options.threshold;
  rule.fallback =
      options.fallback == "exact" ? runtime::SelectionFallback::exact : runtime::SelectionFallback::most_accurate;
  bool any_from_database = false, any_from_paper = false;

  size_t layer_width = 5;
  for (const LayerFiles &files : layers)
    layer_width = std::max(layer_width, files.layer.size());
  std::string header = fmt::format("{:<{}} {:>6} {:>3} {:>4}", "layer", layer_width, "tokens", "h", "d");
  for (const std::string &preset : options.candidates)
    header += fmt::format(" {:>10}", preset);
  fmt::print("cosine similarity to exact attention (threshold {})\n{}  choice\n", options.threshold, header);

  for (const LayerFiles &files : layers) {
    const LayerSamples samples = loadLayer(files);
    const reference::HostTensor &q = samples.q, &k = samples.k, &v = samples.v;
    const int head_dim = static_cast<int>(q.dim());
    PresetOptions preset_options;
    preset_options.head_dim = head_dim;
    preset_options.causal = options.causal;
    std::vector<AttentionVariant> variants;
    for (const std::string &name : options.candidates)
      variants.push_back(preset_options.builder(name).describe());

    // The exact output and every candidate's, on as many threads.
    auto exact = std::async(std::launch::async, [&] { return reference::exactAttention(q, k, v, options.causal); });
    std::vector<std::future<reference::AttentionResult>> runs;
    for (const AttentionVariant &variant : variants)
      runs.push_back(
          std::async(std::launch::async, [&q, &k, &v, variant] { return reference::runReference(variant, q, k, v); }));
    const reference::AttentionResult exact_result = exact.get();
    checkFinite(exact_result.output, files, "exact attention");
    std::vector<runtime::CandidateAccuracy> accuracies;
    for (size_t i = 0; i < runs.size(); ++i) {
      const reference::AttentionResult result = runs[i].get();
      checkFinite(result.output, files, "preset " + options.candidates[i]);
      const reference::AccuracyMetrics metrics = reference::compareOutputs(exact_result.output, result.output);
      accuracies.push_back({options.candidates[i], metrics.cosine_similarity, metrics.relative_l1});
    }

    bool from_database = false;
    rule.fastest_first = speedOrder(options, database, device, head_dim, q.tokens(), from_database);
    any_from_database = any_from_database || from_database;
    any_from_paper = any_from_paper || !from_database;
    runtime::LayerChoice choice = runtime::chooseLayerPreset(files.layer, accuracies, rule);
    std::string row =
        fmt::format("{:<{}} {:>6} {:>3} {:>4}", files.layer, layer_width, q.tokens(), q.heads(), head_dim);
    for (const runtime::CandidateAccuracy &accuracy : choice.candidates)
      row += fmt::format(" {:>10.6f}", accuracy.cos_similarity);
    fmt::print("{}  {}: {}\n", row, choice.preset, choice.reason);
    choices.layers.push_back(std::move(choice));
  }
  const std::string paper = "paper (SageAttention, section 4.5 and Table 6: sage-vb, sage-vt, sage-b, sage-t)";
  const std::string tuned = device ? "tuning database (" + device->gpu + ")" : std::string();
  choices.speed_order = any_from_database && any_from_paper ? tuned + " where it has every candidate, else " + paper
                        : any_from_database                 ? tuned
                                                            : paper;
  fmt::print("fastest first: {}\n", choices.speed_order);
  try {
    runtime::saveLayerChoices(options.output, choices);
  } catch (const runtime::LayerChoicesError &error) {
    throw UserError(std::string("--output: ") + error.what());
  }
  fmt::print("wrote {} layer choice{} to {}\n", choices.layers.size(), choices.layers.size() == 1 ? "" : "s",
             options.output);
}

} // namespace

CommandAction addSelectCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand(
      "select", "choose per layer the fastest preset whose accuracy on sample Q/K/V reaches a threshold");
  auto options = std::make_shared<SelectOptions>();
  command
      ->add_option("SAMPLES", options->samples,
                   "a directory of <layer>.q.npy/.k.npy/.v.npy ([heads, tokens, head_dim], f16 or f32), or a JSON "
                   "list [{\"layer\", \"q\", \"k\", \"v\"}, ...]")
      ->required();
  command->add_option("--candidates", options->candidates, "presets to choose from")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--threshold", options->threshold, "minimum cosine similarity to exact attention")
      ->capture_default_str();
  command->add_flag("--causal", options->causal, "the layers use a causal mask");
  command->add_option("--fallback", options->fallback, "when no candidate passes: exact or most-accurate")
      ->capture_default_str();
  command->add_option("--output,-o", options->output, "the JSON file of choices")->capture_default_str();
  command->add_option("--db", options->database,
                      "tuning database for the speed order (default: $SAGEGEN_TUNING_DB, else the cache's)");
  command->add_option("--input", options->input, "the input type the layers run with (for the database's times)")
      ->capture_default_str();
  return [options] { select(*options); };
}

} // namespace sage::tool
