// `sagegen reference`: runs variants on the CPU reference and compares them with exact attention.
#include "IrFile.h"
#include "PresetOptions.h"
#include "ReferenceDataOptions.h"

#include "sage/dsl/Attention.h"
#include "sage/ir/Program.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

namespace sage::tool {
namespace {

struct ReferenceOptions : ReferenceDataOptions {
  ReferenceOptions() { heads = 2; }
  PresetOptions preset;
  std::vector<std::string> presets;
  std::string ir_file;
  std::string layout = "hnd";
  double k_bias = 0.0, q_bias = 0.0, q_outliers = 1.0, k_outliers = 1.0;
  bool rotate = false; // also run each variant with Q and K rotated (issue 28)
  uint32_t rotation_seed = dsl::kDefaultRotationSeed;
};

reference::Layout layoutOf(const std::string &text) {
  if (text == "hnd" || text == "HND")
    return reference::Layout::hnd;
  if (text == "nhd" || text == "NHD")
    return reference::Layout::nhd;
  throw UserError("--layout: expected hnd or nhd, got '" + text + "'");
}

// `variant` with Q and K rotated by the randomized Hadamard transform (issue 28), named `<name>-rot`, verified.
AttentionVariant rotatedVariant(AttentionVariant variant, uint32_t seed) {
  variant.name += "-rot";
  variant.q.rotation_seed = seed;
  variant.k.rotation_seed = seed;
  return dsl::emitProgram(variant).variant(); // the verifier's reason when it cannot be rotated (ProgramError)
}

AttentionVariant variantFromFile(const std::string &path) {
  return ir::Program::parse(readIrFile(path, "--ir"), path).variant();
}

// Channels that --q-outliers / --k-outliers scale: 4 (bench/accuracy_bench.py's q_outliers class), none at 1.
int64_t outlierChannels(double factor) { return factor != 1.0 ? 4 : 0; }

void run(const ReferenceOptions &options) {
  const int64_t kv_tokens = options.kv_tokens > 0 ? options.kv_tokens : options.tokens;
  const int64_t kv_heads = options.kv_heads > 0 ? options.kv_heads : options.heads;
  if (options.heads % kv_heads != 0)
    throw UserError("--kv-heads: must divide --heads (" + std::to_string(options.heads) + "), got " +
                    std::to_string(kv_heads));

  std::vector<AttentionVariant> variants;
  if (!options.ir_file.empty())
    variants.push_back(variantFromFile(options.ir_file));
  for (const std::string &list : options.presets) {
    std::stringstream names(list);
    for (std::string name; std::getline(names, name, ',');)
      variants.push_back(options.preset.builder(name).build().variant());
  }
  if (variants.empty())
    variants.push_back(options.preset.builder("sage-b").build().variant());
  if (options.rotate) {
    const std::vector<AttentionVariant> given = variants;
    variants.clear();
    for (const AttentionVariant &variant : given) {
      variants.push_back(variant);
      variants.push_back(rotatedVariant(variant, options.rotation_seed));
    }
  }

  const auto storage = options.storage();
  const auto layout = layoutOf(options.layout);
  const int64_t d = variants.front().head_dim;
  for (const AttentionVariant &variant : variants)
    if (variant.head_dim != d)
      throw UserError("--ir/--preset: all variants must share one head dim");
  try {
    reference::checkReferenceShape(options.batch, options.heads, kv_heads, options.tokens, kv_tokens, d);
  } catch (const std::invalid_argument &error) {
    throw UserError(std::string("--batch/--heads/--kv-heads/--n/--n-kv: ") + error.what());
  }
  auto q = reference::randomTensor(
      options.batch, options.heads, options.tokens, d, storage, layout,
      {options.seed * 3 + 1, 0.0, 1.0, options.q_bias, outlierChannels(options.q_outliers), options.q_outliers});
  auto k = reference::randomTensor(
      options.batch, kv_heads, kv_tokens, d, storage, layout,
      {options.seed * 3 + 2, 0.0, 1.0, options.k_bias, outlierChannels(options.k_outliers), options.k_outliers});
  auto v = reference::randomTensor(options.batch, kv_heads, kv_tokens, d, storage, layout,
                                   {options.seed * 3 + 3, 0.0, 1.0, 0.0});
  const bool causal = variants.front().mask.kind == MaskKind::causal;
  const auto exact = reference::exactAttention(q, k, v, causal);

  fmt::print("N(0,1) data, batch {} heads {}/{} n_q {} n_kv {} d {} {} {} causal={} q_bias={} k_bias={} "
             "q_outliers={} k_outliers={} seed={}\n",
             options.batch, options.heads, kv_heads, options.tokens, kv_tokens, d, options.dtype, options.layout,
             causal ? "yes" : "no", options.q_bias, options.k_bias, options.q_outliers, options.k_outliers,
             options.seed);
  size_t name_width = 12;
  for (const AttentionVariant &variant : variants)
    name_width = std::max(name_width, variant.name.size());
  fmt::print("{:<{}} {:>10} {:>9} {:>10} {:>13} {:>9}\n", "variant", name_width, "cos_sim", "rel_l1", "rmse",
             "lse_max_err", "seconds");
  for (const AttentionVariant &variant : variants) {
    if ((variant.mask.kind == MaskKind::causal) != causal)
      throw UserError("--ir/--preset: all variants must share one mask");
    const auto start = std::chrono::steady_clock::now();
    const auto result = reference::runReference(variant, q, k, v);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto metrics = reference::compareOutputs(exact.output, result.output);
    double lse_error = 0.0;
    for (size_t i = 0; i < exact.lse.size(); ++i)
      if (std::isfinite(exact.lse[i]))
        lse_error = std::max(lse_error, std::fabs(exact.lse[i] - result.lse[i]));
    fmt::print("{:<{}} {:>10.6f} {:>9.4f} {:>10.2e} {:>13} {:>9.2f}\n", variant.name, name_width,
               metrics.cosine_similarity, metrics.relative_l1, metrics.rmse,
               variant.epilogue.write_lse ? fmt::format("{:.2e}", lse_error) : std::string("-"), seconds);
  }
}

} // namespace

CommandAction addReferenceCommand(CLI::App &app) {
  CLI::App *command =
      app.add_subcommand("reference", "run variants on the CPU reference and compare them with exact attention");
  auto options = std::make_shared<ReferenceOptions>();
  command->add_option("--preset", options->presets, "preset name(s), repeatable or comma-separated")->delimiter(',');
  command->add_option("--ir", options->ir_file, "a textual sage IR file to run instead of / besides presets");
  options->addDataOptions(*command, "Q, K, V");
  command->add_option("--layout", options->layout, "hnd or nhd")->capture_default_str();
  command
      ->add_option("--k-bias", options->k_bias,
                   "stddev of a per-channel bias shared by all K tokens (the outliers K smoothing removes)")
      ->capture_default_str()
      ->check(finiteRange(0.0, 1e4));
  command
      ->add_option("--q-bias", options->q_bias,
                   "stddev of a per-channel bias shared by all Q tokens (the outliers Q smoothing removes)")
      ->capture_default_str()
      ->check(finiteRange(0.0, 1e4));
  command
      ->add_option("--q-outliers", options->q_outliers,
                   "multiply 4 channels of Q (bias included) by this factor: outlier channels that smoothing cannot "
                   "remove (SageAttention2's Q outliers)")
      ->capture_default_str()
      ->check(finiteRange(1.0, 1e4));
  command->add_option("--k-outliers", options->k_outliers, "the same for 4 channels of K")
      ->capture_default_str()
      ->check(finiteRange(1.0, 1e4));
  command->add_flag("--rotate", options->rotate,
                    "also run every variant with Q and K rotated by a randomized Hadamard transform before "
                    "quantization (<name>-rot; head dim a power of two)");
  command->add_option("--rotation-seed", options->rotation_seed, "the seed of --rotate's random signs")
      ->capture_default_str();
  options->preset.addTo(*command);
  return [options] { run(*options); };
}

} // namespace sage::tool
