// The `sage` dialect: one attention variant as a program of the algorithm's steps.
#ifndef SAGE_DIALECT_TD
#define SAGE_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Sage_Dialect : Dialect {
  let name = "sage";
  let cppNamespace = "::sage::ir";
  let summary = "Quantized tiled attention: smoothing, quantizers, matmuls, online softmax, accumulation";
  let description = [{
    A `sage.attention` op holds one attention variant. Its body is a dataflow program over abstract
    tiles (`!sage.tile`): the inputs Q, K, V, their smoothing and quantization, the Q.K^T and P.V
    matrix products with their operand and accumulator types, dequantization, masks, the online
    softmax, the accumulation of O, and the epilogue (normalize, write O, write LSE).
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
}

// Enumerations mirror sage/ir/AttentionVariant.h case for case; Extract.cpp maps them by name.
class Sage_Enum<string name, string summary, list<I32EnumAttrCase> cases>
    : I32EnumAttr<name, summary, cases> {
  let cppNamespace = "::sage::ir";
  let genSpecializedAttr = 0;
}

def Sage_ElementType : Sage_Enum<"ElementType", "element type", [
  I32EnumAttrCase<"f32", 0>, I32EnumAttrCase<"f16", 1>, I32EnumAttrCase<"bf16", 2>,
  I32EnumAttrCase<"int8", 3>, I32EnumAttrCase<"int4", 4>, I32EnumAttrCase<"e4m3", 5>,
  I32EnumAttrCase<"e5m2", 6>, I32EnumAttrCase<"e2m1", 7>]>;

def Sage_Granularity : Sage_Enum<"Granularity", "quantization granularity", [
  I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"per_tensor", 1>, I32EnumAttrCase<"per_token", 2>,
  I32EnumAttrCase<"per_block", 3>, I32EnumAttrCase<"per_warp", 4>, I32EnumAttrCase<"per_thread", 5>,
  I32EnumAttrCase<"per_channel", 6>, I32EnumAttrCase<"microscale_1x16", 7>, I32EnumAttrCase<"microscale_1x32", 8>]>;

def Sage_ScaleType : Sage_Enum<"ScaleType", "scale type", [
  I32EnumAttrCase<"f32", 0>, I32EnumAttrCase<"ue4m3", 1>, I32EnumAttrCase<"ue8m0", 2>]>;

def Sage_AccumulatorType : Sage_Enum<"AccumulatorType", "mma accumulator type", [
  I32EnumAttrCase<"s32", 0>, I32EnumAttrCase<"f16", 1>, I32EnumAttrCase<"f32", 2>]>;

def Sage_AccumulationKind : Sage_Enum<"AccumulationKind", "accumulation of O across KV blocks", [
  I32EnumAttrCase<"f32", 0>, I32EnumAttrCase<"f16", 1>, I32EnumAttrCase<"f16_then_f32", 2>,
  I32EnumAttrCase<"f32_two_level", 3>]>;

def Sage_MaskKind : Sage_Enum<"MaskKind", "attention mask", [
  I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"causal", 1>, I32EnumAttrCase<"block_sparse", 2>]>;

def Sage_SmoothScope : Sage_Enum<"SmoothScope", "tokens averaged by smoothing", [
  I32EnumAttrCase<"sequence", 1>, I32EnumAttrCase<"block", 2>]>;

def Sage_TensorRole : Sage_Enum<"TensorRole", "attention input", [
  I32EnumAttrCase<"q", 0>, I32EnumAttrCase<"k", 1>, I32EnumAttrCase<"v", 2>]>;

def Sage_SoftmaxBase : Sage_Enum<"SoftmaxBase", "exponential of the softmax", [
  I32EnumAttrCase<"exp2", 0>, I32EnumAttrCase<"exp", 1>]>;

def Sage_ElementTypeAttr : EnumAttr<Sage_Dialect, Sage_ElementType, "element_type">;
def Sage_GranularityAttr : EnumAttr<Sage_Dialect, Sage_Granularity, "granularity">;
def Sage_ScaleTypeAttr : EnumAttr<Sage_Dialect, Sage_ScaleType, "scale_type">;
def Sage_AccumulatorTypeAttr : EnumAttr<Sage_Dialect, Sage_AccumulatorType, "accumulator">;
def Sage_AccumulationKindAttr : EnumAttr<Sage_Dialect, Sage_AccumulationKind, "accumulation">;
def Sage_MaskKindAttr : EnumAttr<Sage_Dialect, Sage_MaskKind, "mask_kind">;
def Sage_SmoothScopeAttr : EnumAttr<Sage_Dialect, Sage_SmoothScope, "smooth_scope">;
def Sage_TensorRoleAttr : EnumAttr<Sage_Dialect, Sage_TensorRole, "role">;
def Sage_SoftmaxBaseAttr : EnumAttr<Sage_Dialect, Sage_SoftmaxBase, "softmax_base">;

// An abstract tile of a tensor flowing through the program; its meaning comes from its producer.
def Sage_TileType : TypeDef<Sage_Dialect, "Tile"> {
  let mnemonic = "tile";
  let summary = "a tile of Q, K, V, S, P or O";
}

#endif // SAGE_DIALECT_TD
