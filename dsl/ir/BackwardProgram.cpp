#include "sage/ir/BackwardProgram.h"

#include "BackwardDataflow.h"
#include "ParseSupport.h"
#include "sage/ir/Dialect.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <stdexcept>

namespace sage::ir {

struct BackwardProgram::State : detail::ModuleState {};

namespace {

AttentionBackwardOp programOf(mlir::ModuleOp module) { return detail::programOpOf<AttentionBackwardOp>(module); }

// A module must hold exactly one sage.attention_backward and nothing else.
constexpr std::string_view kKind = "backward program";

// The dialect's enums share their spellings with the vocabulary's.
template <typename Result> Result mapByName(std::optional<Result> mapped, llvm::StringRef name) {
  if (!mapped)
    throw std::logic_error("sage dialect keyword '" + name.str() + "' has no vocabulary counterpart");
  return *mapped;
}

QuantizerSpec toQuantizerSpec(BwdQuantizeOp op) {
  QuantizerSpec spec;
  spec.dtype =
      mapByName(parseElementType(stringifyElementType(op.getDtype()).str()), stringifyElementType(op.getDtype()));
  spec.granularity = mapByName(parseGranularity(stringifyGranularity(op.getGranularity()).str()),
                               stringifyGranularity(op.getGranularity()));
  spec.group_tokens = static_cast<int>(op.getGroupTokens());
  if (const mlir::IntegerAttr seed = op.getRotationSeedAttr()) // the verifier checked its range
    spec.rotation_seed = static_cast<uint32_t>(seed.getInt());
  return spec;
}

BackwardVariant extractBackwardVariant(AttentionBackwardOp program) {
  BackwardVariant variant;
  variant.name = program.getSymName().str();
  variant.version = static_cast<int>(program.getVersion());
  variant.head_dim = static_cast<int>(program.getHeadDim());
  variant.block_q = static_cast<int>(program.getBlockQ());
  variant.block_kv = static_cast<int>(program.getBlockKv());
  for (mlir::Operation &op : program.getBody().front()) {
    if (auto mma = mlir::dyn_cast<BwdMmaOp>(op)) {
      BackwardProductSpec &spec = variant.product(*backward::productOf(mma));
      spec.lhs = toQuantizerSpec(mma.getLhs().getDefiningOp<BwdQuantizeOp>());
      spec.rhs = toQuantizerSpec(mma.getRhs().getDefiningOp<BwdQuantizeOp>());
      spec.accumulator = mapByName(parseAccumulatorType(stringifyAccumulatorType(mma.getAccumulator()).str()),
                                   stringifyAccumulatorType(mma.getAccumulator()));
    } else if (mlir::isa<BwdSmoothOp>(op)) { // the verifier allows only K over the sequence
      variant.smooth_k = sage::SmoothScope::sequence;
    } else if (auto mask = mlir::dyn_cast<BwdMaskOp>(op)) {
      variant.mask =
          mapByName(parseMaskKind(stringifyMaskKind(mask.getKind()).str()), stringifyMaskKind(mask.getKind()));
    }
  }
  return variant;
}

} // namespace

BackwardProgram::BackwardProgram(std::unique_ptr<State> state) : state_(std::move(state)) {}
BackwardProgram::BackwardProgram(BackwardProgram &&) noexcept = default;
BackwardProgram &BackwardProgram::operator=(BackwardProgram &&) noexcept = default;
BackwardProgram::~BackwardProgram() = default;

BackwardProgram BackwardProgram::parse(std::string_view text, std::string_view source_name) {
  auto state = std::make_unique<State>();
  detail::parseProgramModule<AttentionBackwardOp>(*state, text, source_name, kKind);
  return BackwardProgram(std::move(state));
}

BackwardProgram BackwardProgram::adopt(std::unique_ptr<mlir::MLIRContext> context, mlir::ModuleOp module) {
  auto state = std::make_unique<State>();
  detail::adoptProgramModule<AttentionBackwardOp>(*state, std::move(context), module, kKind);
  return BackwardProgram(std::move(state));
}

std::string BackwardProgram::print() const { return detail::printedText(programOf(*state_->module)); }

std::string BackwardProgram::name() const { return programOf(*state_->module).getSymName().str(); }

BackwardVariant BackwardProgram::variant() const { return extractBackwardVariant(programOf(*state_->module)); }

std::string BackwardProgram::fingerprint() const { return detail::fingerprintOf(print()); }

bool looksLikeBackwardProgram(std::string_view text) {
  const size_t backward = text.find("sage.attention_backward");
  if (backward == std::string_view::npos)
    return false;
  const size_t forward = text.find("sage.attention ");
  return forward == std::string_view::npos || backward < forward;
}

} // namespace sage::ir
