// `sagegen reference-backward`: runs backward presets (SageBwd) on the CPU reference, after their forward, and
// compares dQ, dK, dV with the exact gradients of softmax attention.
#include "Commands.h"
#include "ReferenceDataOptions.h"

#include "sage/dsl/Attention.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/reference/Backward.h"
#include "sage/reference/Reference.h"

#include <fmt/core.h>

#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

namespace sage::tool {
namespace {

struct BackwardReferenceOptions : ReferenceDataOptions {
  std::vector<std::string> presets;
  int head_dim = 128;
  bool causal = false;
  double k_bias = 0.0, v_bias = 0.0, q_outliers = 1.0;
  bool no_smooth_k = false;
  bool token_scales = false;         // issue 25: P and dS with one int8 scale per token of their product's output
  bool rotate = false;               // issue 25/28: Q and K rotated in the forward and in the backward's S, dQ and dK
  std::vector<std::string> exact;    // the error attribution: operands kept exact (f32), "forward" for O and the LSE
  std::vector<std::string> quantize; // candidate quantizers: <operand>=<dtype>[:<granularity>]
};

// The operands --exact and --quantize name: "<product>.<operand>" (the quantizer of one GEMM operand).
struct NamedOperand {
  std::string_view name;
  BackwardProduct product;
  bool lhs;
};
constexpr NamedOperand kNamedOperands[] = {{"s.q", BackwardProduct::s, true},    {"s.k", BackwardProduct::s, false},
                                           {"dp.do", BackwardProduct::dp, true}, {"dp.v", BackwardProduct::dp, false},
                                           {"dv.p", BackwardProduct::dv, true},  {"dv.do", BackwardProduct::dv, false},
                                           {"dq.ds", BackwardProduct::dq, true}, {"dq.k", BackwardProduct::dq, false},
                                           {"dk.ds", BackwardProduct::dk, true}, {"dk.q", BackwardProduct::dk, false}};

QuantizerSpec &namedOperand(BackwardVariant &variant, std::string_view name, std::string_view option) {
  for (const NamedOperand &operand : kNamedOperands)
    if (operand.name == name) {
      BackwardProductSpec &product = variant.product(operand.product);
      return operand.lhs ? product.lhs : product.rhs;
    }
  std::string known;
  for (const NamedOperand &operand : kNamedOperands)
    known += (known.empty() ? "" : ", ") + std::string(operand.name);
  throw UserError(std::string(option) + ": unknown operand '" + std::string(name) + "'; expected one of " + known +
                  (option == "--exact" ? ", forward" : ""));
}

// "<operand>=<dtype>[:<granularity>]", e.g. dv.p=f16, dk.ds=int8:per_token, dq.ds=e4m3:per_block.
void applyQuantize(BackwardVariant &variant, const std::string &text) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    throw UserError("--quantize: expected <operand>=<dtype>[:<granularity>], got '" + text + "'");
  QuantizerSpec &spec = namedOperand(variant, text.substr(0, equals), "--quantize");
  const std::string type = text.substr(equals + 1);
  const size_t colon = type.find(':');
  const std::optional<ElementType> dtype = parseElementType(type.substr(0, colon));
  const std::optional<Granularity> granularity = colon == std::string::npos
                                                     ? std::optional<Granularity>(Granularity::none)
                                                     : parseGranularity(type.substr(colon + 1));
  if (!dtype || !granularity)
    throw UserError("--quantize: '" + type + "' of '" + text +
                    "' is not <dtype>[:<granularity>] (e.g. f16, int8:per_block)");
  const bool tile = text.starts_with("dv.p=") || text.starts_with("dq.ds=") || text.starts_with("dk.ds=");
  if (tile && *granularity != Granularity::none && *granularity != Granularity::per_block &&
      *granularity != Granularity::per_token)
    throw UserError("--quantize: P and dS tiles (dv.p, dq.ds, dk.ds) take one scale per tile (per_block) or per token "
                    "of the product's output (per_token), not '" +
                    std::string(nameOf(*granularity)) + "' in '" + text + "'");
  const std::optional<uint32_t> seed = spec.rotation_seed;
  spec = QuantizerSpec{*dtype, *granularity, *granularity == Granularity::per_block ? spec.group_tokens : 0};
  if (*granularity != Granularity::none)
    spec.rotation_seed = seed;
}

// The variant with the --quantize operands' quantizers replaced and the --exact ones made an f32 cast: the CPU
// reference's error attribution and its candidate quantizers. The reference interprets the variant without its IR
// (a product may then mix an f32 operand with an int8 one, which no kernel runs). Returns whether the forward is to
// be exact too ("forward": O and the LSE from exact attention).
bool applyAblation(BackwardVariant &variant, const BackwardReferenceOptions &options) {
  for (const std::string &text : options.quantize)
    applyQuantize(variant, text);
  bool forward = false;
  for (const std::string &name : options.exact)
    if (name == "forward")
      forward = true;
    else
      namedOperand(variant, name, "--exact") = QuantizerSpec{ElementType::f32};
  return forward;
}

std::string ablationText(const BackwardReferenceOptions &options) {
  std::string text;
  for (const std::string &name : options.quantize)
    text += (text.empty() ? "; quantizers: " : ",") + name;
  for (size_t i = 0; i < options.exact.size(); ++i)
    text += (i == 0 ? "; exact (f32): " : ",") + options.exact[i];
  return text;
}

// The forward rotated as its backward is (one seed for both passes: a rotating backward's variant says so on S's Q),
// through its IR (verified).
AttentionVariant pairedForward(AttentionVariant forward, const BackwardVariant &backward) {
  const std::optional<uint32_t> seed = backward.product(BackwardProduct::s).lhs.rotation_seed;
  if (!seed)
    return forward;
  forward.q.rotation_seed = forward.k.rotation_seed = *seed;
  return dsl::emitProgram(forward).variant();
}

dsl::AttentionBackwardBuilder backwardBuilder(const std::string &name, int head_dim, MaskKind mask) {
  std::optional<dsl::AttentionBackwardBuilder> found;
  try {
    found = dsl::backwardPreset(name, head_dim, mask);
  } catch (const std::invalid_argument &error) {
    throw UserError(std::string("--headdim: ") + error.what());
  }
  if (!found) {
    std::string known;
    for (const auto &info : dsl::backwardPresets())
      known += (known.empty() ? "" : ", ") + std::string(info.name);
    throw UserError("--preset: unknown backward preset '" + name + "'; expected one of " + known);
  }
  return *found;
}

void run(const BackwardReferenceOptions &options) {
  const int64_t kv_tokens = options.kv_tokens > 0 ? options.kv_tokens : options.tokens;
  const int64_t kv_heads = options.kv_heads > 0 ? options.kv_heads : options.heads;
  if (options.heads % kv_heads != 0)
    throw UserError("--kv-heads: must divide --heads (" + std::to_string(options.heads) + "), got " +
                    std::to_string(kv_heads));
  const MaskKind mask = options.causal ? MaskKind::causal : MaskKind::none;
  std::vector<std::string> names;
  for (const std::string &list : options.presets) {
    std::stringstream stream(list);
    for (std::string name; std::getline(stream, name, ',');)
      names.push_back(name);
  }
  if (names.empty())
    names = {"sagebwd", "sagebwd-int8-dp"};
  struct Run {
    BackwardVariant variant, ablated; // the preset's (through the IR) and with --quantize / --exact applied
    bool exact_forward;
  };
  std::vector<Run> runs;
  for (const std::string &name : names) {
    dsl::AttentionBackwardBuilder builder = backwardBuilder(name, options.head_dim, mask);
    builder.smooth_k(!options.no_smooth_k);
    if (options.token_scales)
      builder.token_scales();
    if (options.rotate) {
      if (name == "exact-bwd")
        throw UserError("--rotate: exact-bwd quantizes nothing, so there is nothing to rotate; drop it from --preset");
      builder.rotate();
    }
    try { // through the IR: the verifier checks the rotation (a power-of-two head_dim)
      BackwardVariant variant = builder.build().variant();
      BackwardVariant ablated = variant;
      const bool exact_forward = applyAblation(ablated, options);
      runs.push_back({std::move(variant), std::move(ablated), exact_forward});
    } catch (const ir::ProgramError &error) {
      throw UserError(std::string(options.rotate ? "--rotate/--headdim: " : "--preset/--headdim: ") + error.what());
    }
  }

  const int64_t d = options.head_dim;
  try {
    reference::checkReferenceShape(options.batch, options.heads, kv_heads, options.tokens, kv_tokens, d);
  } catch (const std::invalid_argument &error) {
    throw UserError(std::string("--batch/--heads/--kv-heads/--n/--n-kv: ") + error.what());
  }
  const auto storage = options.storage();
  const auto layout = reference::Layout::hnd;
  auto q = reference::randomTensor(
      options.batch, options.heads, options.tokens, d, storage, layout,
      {options.seed * 4 + 1, 0.0, 1.0, 0.0, options.q_outliers != 1.0 ? 4 : 0, options.q_outliers});
  auto k = reference::randomTensor(options.batch, kv_heads, kv_tokens, d, storage, layout,
                                   {options.seed * 4 + 2, 0.0, 1.0, options.k_bias});
  auto v = reference::randomTensor(options.batch, kv_heads, kv_tokens, d, storage, layout,
                                   {options.seed * 4 + 3, 0.0, 1.0, options.v_bias});
  auto d_o = reference::randomTensor(options.batch, options.heads, options.tokens, d, storage, layout,
                                     {options.seed * 4 + 4, 0.0, 1.0, 0.0});
  const auto exact = reference::exactAttentionBackward(q, k, v, d_o, options.causal);

  fmt::print("N(0,1) data (dO too), batch {} heads {}/{} n_q {} n_kv {} d {} {} causal={} k_bias={} v_bias={} "
             "q_outliers={} seed={}; K smoothing {}{}{}{}; gradients against exact attention's, in double\n",
             options.batch, options.heads, kv_heads, options.tokens, kv_tokens, d, options.dtype,
             options.causal ? "yes" : "no", options.k_bias, options.v_bias, options.q_outliers, options.seed,
             options.no_smooth_k ? "off (--no-smooth-k)" : "on", options.rotate ? "; Q and K rotated (--rotate)" : "",
             options.token_scales ? "; P and dS scaled per token (--token-scales)" : "", ablationText(options));
  fmt::print("{:<16} {:<8} {:>9} {:>8} {:>9} {:>8} {:>9} {:>8} {:>8}\n", "backward", "forward", "dq_cos", "dq_rl1",
             "dk_cos", "dk_rl1", "dv_cos", "dv_rl1", "seconds");
  for (const auto &[variant, ablated, exact_forward] : runs) {
    const std::string_view forward_name = dsl::backwardPresetForward(variant.name);
    const AttentionVariant forward =
        exact_forward ? dsl::preset("exact", options.head_dim, mask)->lse().describe()
                      : pairedForward(dsl::preset(forward_name, options.head_dim, mask)->lse().describe(), variant);
    const auto start = std::chrono::steady_clock::now();
    const auto result = reference::runForwardBackwardReference(forward, ablated, q, k, v, d_o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto accuracy = reference::compareGradients(exact, result);
    fmt::print("{:<16} {:<8} {:>9.6f} {:>8.4f} {:>9.6f} {:>8.4f} {:>9.6f} {:>8.4f} {:>8.2f}\n", variant.name,
               exact_forward ? "exact" : forward_name, accuracy.dq.cosine_similarity, accuracy.dq.relative_l1,
               accuracy.dk.cosine_similarity, accuracy.dk.relative_l1, accuracy.dv.cosine_similarity,
               accuracy.dv.relative_l1, seconds);
  }
}

} // namespace

CommandAction addReferenceBackwardCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand(
      "reference-backward", "run backward presets (SageBwd) on the CPU reference and compare dQ, dK, dV with exact "
                            "attention's gradients");
  auto options = std::make_shared<BackwardReferenceOptions>();
  command
      ->add_option("--preset", options->presets,
                   "backward preset name(s), comma-separated (default: sagebwd,sagebwd-int8-dp)")
      ->delimiter(',');
  command->add_option("--headdim", options->head_dim, "head dimension d")->capture_default_str();
  command->add_flag("--causal", options->causal, "causal mask (bottom-right aligned when n_q != n_kv)");
  options->addDataOptions(*command, "Q, K, V, dO");
  command->add_option("--k-bias", options->k_bias, "stddev of a per-channel bias shared by all K tokens")
      ->capture_default_str()
      ->check(finiteRange(0.0, 1e4));
  command
      ->add_option("--v-bias", options->v_bias,
                   "stddev of a per-channel bias shared by all V tokens (where an int8 dO.V^T loses most)")
      ->capture_default_str()
      ->check(finiteRange(0.0, 1e4));
  command
      ->add_option("--q-outliers", options->q_outliers,
                   "factor of 4 outlier channels of Q (channels k d / 4; 1: none), as bench/accuracy_bench.py's "
                   "q_outliers (20)")
      ->capture_default_str()
      ->check(finiteRange(1.0, 1e4));
  command->add_flag("--rotate", options->rotate,
                    "rotate Q and K by a randomized Hadamard transform before quantizing them, in the forward and in "
                    "the backward's S, dQ and dK (issue 25/28: the presets' rotate(), as sagebwd-rot; a rotating "
                    "backward preset rotates its forward too)");
  command->add_flag(
      "--token-scales", options->token_scales,
      "P and dS in int8 with one scale per token of their product's output (per key for dV and dK, "
      "per query for dQ) instead of one per 64x64 tile (issue 25; the presets with kernels: sagebwd-rot-ks per key, "
      "sagebwd-rot-qks per key and per query)");
  command->add_flag("--no-smooth-k", options->no_smooth_k,
                    "the ablation: the backward recomputes S and forms dQ from K as given, without K smoothing");
  command
      ->add_option("--exact", options->exact,
                   "the error attribution: keep these GEMM operands exact (f32) on the CPU reference, comma-separated: "
                   "s.q, s.k, dp.do, dp.v, dv.p, dv.do, dq.ds, dq.k, dk.ds, dk.q (<product>.<operand>), or forward "
                   "(O and the LSE from exact attention)")
      ->delimiter(',');
  command
      ->add_option("--quantize", options->quantize,
                   "candidate quantizers on the CPU reference, comma-separated <operand>=<dtype>[:<granularity>] "
                   "(operands as --exact; e.g. dv.p=f16, dk.ds=int8:per_token, dq.ds=e4m3:per_block; P and dS "
                   "tiles: per_block is one scale per 64x64 tile, per_token one per key for dv.p and dk.ds and one "
                   "per query for dq.ds)")
      ->delimiter(',');
  return [options] { run(*options); };
}

} // namespace sage::tool
