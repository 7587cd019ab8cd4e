// The legalization pass: decode the mma operands a target cannot multiply (see sage/ir/Legalize.h).
#include "sage/ir/Legalize.h"

#include "Dataflow.h"
#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <array>
#include <stdexcept>

namespace sage::ir {
namespace {

// sm_100f / sm_120f are the family targets the runtime compiles for (the "a" targets load only on 10.0 / 12.0).
// sm_100a/f decode FP4: their block-scaled FP4 mma is tcgen05's (ptxas 13.0 rejects the mma.sync form there), and
// no schedule lowers to tcgen05 yet, so the emulation is what runs there.
// Not constexpr: clang 14 (the fuzz and sanitizer builds) has no constexpr std::string.
const std::array<TargetCapabilities, 8> kTargets{{
    {"sm_80", false, true},
    {"sm_86", false, true},
    {"sm_89", false, true},
    {"sm_90a", false, false},
    {"sm_100a", false, false},
    {"sm_120a", true, false},
    {"sm_100f", false, false},
    {"sm_120f", true, false},
}};

// The type a target without the quantized mma multiplies instead, or nullopt when `quantize`'s codes are fine.
std::optional<ElementType> decodedType(QuantizeOp quantize, const TargetCapabilities &target) {
  if (quantize.getDtype() == ElementType::e2m1 && !target.block_scaled_fp4) {
    // sage::fp4DecodedType is the rule the sm80 schedule plans its emulation with; the IR's enums share its spellings.
    const std::optional<sage::Granularity> granularity =
        sage::parseGranularity(stringifyGranularity(quantize.getGranularity()).str());
    if (!granularity)
      return std::nullopt;
    return symbolizeElementType(std::string(sage::nameOf(sage::fp4DecodedType(*granularity))));
  }
  if (quantize.getDtype() == ElementType::int4 && !target.int4_mma)
    return ElementType::int8;
  return std::nullopt;
}

class LegalizeForTargetPass : public mlir::PassWrapper<LegalizeForTargetPass, mlir::OperationPass<mlir::ModuleOp>> {
public:
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(LegalizeForTargetPass)

  explicit LegalizeForTargetPass(TargetCapabilities target) : target_(std::move(target)) {}
  llvm::StringRef getArgument() const override { return "sage-legalize-for-target"; }
  llvm::StringRef getDescription() const override { return "decode mma operands the target cannot multiply"; }

  void runOnOperation() override {
    getOperation().walk([&](MmaOp mma) {
      mlir::OpBuilder builder(mma);
      for (mlir::OpOperand &operand : mma->getOpOperands()) {
        QuantizeOp quantize = operand.get().getDefiningOp<QuantizeOp>(); // a decoded operand is left alone
        if (!quantize)
          continue;
        std::optional<ElementType> type = decodedType(quantize, target_);
        if (!type)
          continue;
        auto decode = builder.create<DecodeOp>(mlir::NameLoc::get(builder.getStringAttr("decode"), mma.getLoc()),
                                               builder.getType<TileType>(), operand.get(), *type);
        operand.set(decode.getResult());
      }
    });
  }

private:
  TargetCapabilities target_;
};

} // namespace

std::optional<TargetCapabilities> targetCapabilities(std::string_view arch) {
  for (const TargetCapabilities &target : kTargets)
    if (target.arch == arch)
      return target;
  return std::nullopt;
}

std::vector<std::string> legalizationTargets() {
  std::vector<std::string> names;
  for (const TargetCapabilities &target : kTargets)
    names.push_back(target.arch);
  return names;
}

Program legalizeForTarget(const Program &program, std::string_view arch) {
  std::optional<TargetCapabilities> target = targetCapabilities(arch);
  if (!target) {
    std::string known;
    for (const std::string &name : legalizationTargets())
      known += (known.empty() ? "" : ", ") + name;
    throw std::invalid_argument("legalize: unknown target '" + std::string(arch) + "'; expected one of " + known);
  }
  // Text in, text out: the rewrite works on its own copy of the program.
  Program legalized = Program::parse(program.print(), program.name() + ".mlir");
  mlir::ModuleOp module = legalized.module();
  std::vector<Diagnostic> diagnostics;
  mlir::ScopedDiagnosticHandler handler(module.getContext(), [&](mlir::Diagnostic &diagnostic) {
    if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error)
      diagnostics.push_back({"", diagnostic.str()});
    return mlir::success();
  });
  mlir::PassManager passes(module.getContext());
  passes.addPass(std::make_unique<LegalizeForTargetPass>(*target)); // verifies the result too
  if (mlir::failed(passes.run(module))) {
    if (diagnostics.empty())
      diagnostics.push_back({"", "legalization for " + std::string(arch) + " failed"});
    throw ProgramError(std::move(diagnostics));
  }
  // Re-parse the printed result: the returned program is exactly what its text says.
  return Program::parse(legalized.print(), program.name() + "." + std::string(arch) + ".mlir");
}

} // namespace sage::ir
