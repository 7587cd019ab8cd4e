// Registration of the sage dialect's ops, types and attributes (the definitions are generated).
#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <memory>
#include <optional>
#include <utility>

#include "SageDialect.cpp.inc"
#include "SageEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "SageAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "SageTypes.cpp.inc"

#define GET_OP_CLASSES
#include "SageOps.cpp.inc"

namespace sage::ir {
namespace {

// Issue 26: with properties, an op's attribute dictionary may name the op's own (inherent) attributes, and what it
// says wins over the op's syntax when the op is created: `sage.mask %s causal {kind = #sage<mask_kind none>}` was a
// non-causal mask. The text a reader sees must be the program that runs, so every sage op is parsed by its generated
// parser and then refused if the dictionary restates an attribute the syntax already set (optional attributes,
// which the printer writes into the dictionary, the syntax never sets).
template <typename ConcreteOp>
mlir::ParseResult parseWithoutRestatedAttributes(mlir::OpAsmParser &parser, mlir::OperationState &result) {
  if (mlir::failed(ConcreteOp::parse(parser, result)))
    return mlir::failure();
  if constexpr (mlir::RegisteredOperationName::Model<ConcreteOp>::hasProperties) {
    using Properties = typename ConcreteOp::template InferredProperties<ConcreteOp>;
    const auto *stated = static_cast<const Properties *>(result.getRawProperties().as<void *>());
    if (stated == nullptr) // the syntax set nothing
      return mlir::success();
    for (const mlir::NamedAttribute &attribute : result.attributes) {
      const std::optional<mlir::Attribute> in_syntax =
          ConcreteOp::getInherentAttr(parser.getContext(), *stated, attribute.getName().getValue());
      if (in_syntax && *in_syntax)
        return parser.emitError(parser.getNameLoc()) // MLIR puts "custom op '<name>' " before this
               << "sets '" << attribute.getName().getValue()
               << "' in its attribute dictionary, which its syntax already gives (" << *in_syntax
               << "): remove it from the dictionary";
    }
  }
  return mlir::success();
}

// MLIR's Model<ConcreteOp>, held (its methods are final) and constructed first: the op's interface map, which only
// MLIR may build, moves from it to this registration.
template <typename ConcreteOp> struct HeldModel {
  explicit HeldModel(mlir::Dialect *dialect) : model_(dialect) {}
  mlir::RegisteredOperationName::Model<ConcreteOp> model_;
};

// MLIR's Model<ConcreteOp> in every respect but the parser.
template <typename ConcreteOp>
class StrictParseModel final : private HeldModel<ConcreteOp>, public mlir::OperationName::Impl {
  using HeldModel<ConcreteOp>::model_;

public:
  explicit StrictParseModel(mlir::Dialect *dialect)
      : HeldModel<ConcreteOp>(dialect), Impl(ConcreteOp::getOperationName(), dialect, mlir::TypeID::get<ConcreteOp>(),
                                             std::move(HeldModel<ConcreteOp>::model_.getInterfaceMap())) {}

  mlir::OperationName::ParseAssemblyFn getParseAssemblyFn() final { return parseWithoutRestatedAttributes<ConcreteOp>; }

  llvm::LogicalResult foldHook(mlir::Operation *op, llvm::ArrayRef<mlir::Attribute> operands,
                               llvm::SmallVectorImpl<mlir::OpFoldResult> &results) final {
    return model_.foldHook(op, operands, results);
  }
  void getCanonicalizationPatterns(mlir::RewritePatternSet &patterns, mlir::MLIRContext *context) final {
    model_.getCanonicalizationPatterns(patterns, context);
  }
  bool hasTrait(mlir::TypeID id) final { return model_.hasTrait(id); }
  void populateDefaultAttrs(const mlir::OperationName &name, mlir::NamedAttrList &attributes) final {
    model_.populateDefaultAttrs(name, attributes);
  }
  void printAssembly(mlir::Operation *op, mlir::OpAsmPrinter &printer, llvm::StringRef name) final {
    model_.printAssembly(op, printer, name);
  }
  llvm::LogicalResult verifyInvariants(mlir::Operation *op) final { return model_.verifyInvariants(op); }
  llvm::LogicalResult verifyRegionInvariants(mlir::Operation *op) final { return model_.verifyRegionInvariants(op); }
  std::optional<mlir::Attribute> getInherentAttr(mlir::Operation *op, llvm::StringRef name) final {
    return model_.getInherentAttr(op, name);
  }
  void setInherentAttr(mlir::Operation *op, mlir::StringAttr name, mlir::Attribute value) final {
    model_.setInherentAttr(op, name, value);
  }
  void populateInherentAttrs(mlir::Operation *op, mlir::NamedAttrList &attributes) final {
    model_.populateInherentAttrs(op, attributes);
  }
  llvm::LogicalResult verifyInherentAttrs(mlir::OperationName name, mlir::NamedAttrList &attributes,
                                          llvm::function_ref<mlir::InFlightDiagnostic()> emitError) final {
    return model_.verifyInherentAttrs(name, attributes, emitError);
  }
  int getOpPropertyByteSize() final { return model_.getOpPropertyByteSize(); }
  void initProperties(mlir::OperationName name, mlir::OpaqueProperties storage, mlir::OpaqueProperties init) final {
    model_.initProperties(name, storage, init);
  }
  void deleteProperties(mlir::OpaqueProperties properties) final { model_.deleteProperties(properties); }
  void populateDefaultProperties(mlir::OperationName name, mlir::OpaqueProperties properties) final {
    model_.populateDefaultProperties(name, properties);
  }
  llvm::LogicalResult setPropertiesFromAttr(mlir::OperationName name, mlir::OpaqueProperties properties,
                                            mlir::Attribute attribute,
                                            llvm::function_ref<mlir::InFlightDiagnostic()> emitError) final {
    return model_.setPropertiesFromAttr(name, properties, attribute, emitError);
  }
  mlir::Attribute getPropertiesAsAttr(mlir::Operation *op) final { return model_.getPropertiesAsAttr(op); }
  void copyProperties(mlir::OpaqueProperties to, mlir::OpaqueProperties from) final { model_.copyProperties(to, from); }
  bool compareProperties(mlir::OpaqueProperties lhs, mlir::OpaqueProperties rhs) final {
    return model_.compareProperties(lhs, rhs);
  }
  llvm::hash_code hashProperties(mlir::OpaqueProperties properties) final { return model_.hashProperties(properties); }
};

template <typename... Ops> void addStrictlyParsedOperations(mlir::Dialect &dialect) {
  (mlir::RegisteredOperationName::insert(std::make_unique<StrictParseModel<Ops>>(&dialect), Ops::getAttributeNames()),
   ...);
}

} // namespace

void SageDialect::initialize() {
  addStrictlyParsedOperations<
#define GET_OP_LIST
#include "SageOps.cpp.inc"
      >(*this);
  addTypes<
#define GET_TYPEDEF_LIST
#include "SageTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "SageAttrs.cpp.inc"
      >();
}

} // namespace sage::ir
