// The ops of the `sage` dialect, one per step of the SageAttention algorithms.
#ifndef SAGE_OPS_TD
#define SAGE_OPS_TD

include "SageDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/IR/OpAsmInterface.td"

// See sage/ir/OpTraits.h: checked before each op's own verifier.
def Sage_OperandsDefinedEarlier : NativeOpTrait<"OperandsDefinedEarlier"> { let cppNamespace = "::sage::ir"; }
def Sage_OnlyKnownAttributes : NativeOpTrait<"OnlyKnownAttributes"> { let cppNamespace = "::sage::ir"; }
def Sage_ProgramName : NativeOpTrait<"ProgramName"> { let cppNamespace = "::sage::ir"; }

// Enum attributes print their own leading space, so formats put an empty literal (``) before them.
class Sage_Op<string mnemonic, list<Trait> traits = []>
    : Op<Sage_Dialect, mnemonic,
         !listconcat([Sage_OperandsDefinedEarlier, Sage_OnlyKnownAttributes, Sage_ProgramName], traits)> {
  let hasVerifier = 1;
}

// Ops with a result name their SSA value after the step (%q, %k_smoothed, %p, ...): see AsmNames.cpp.
class Sage_ValueOp<string mnemonic> : Sage_Op<mnemonic, [DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]>;

def Sage_AttentionOp : Sage_Op<"attention", [IsolatedFromAbove, NoTerminator, SingleBlock, Symbol]> {
  let summary = "one attention variant";
  let description = [{
    `version` is the IR version (sage::kIrVersion); `head_dim` the head dimension d; `block_q` and
    `block_kv` the Q and K/V tile sizes (the paper's b_q and b_kv), which fix the per-block scales.
    `packed_sequences` (issue 28): the batch is sequences of their own lengths packed along the tokens
    (FlashAttention's varlen); every statistic over the sequence (K smoothing's mean, V's per-channel
    scales, Q smoothing's blocks) and the causal mask's alignment are per sequence, so each sequence gets
    what the program computes on it alone.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, I64Attr:$version, I64Attr:$head_dim, I64Attr:$block_q,
                       I64Attr:$block_kv, UnitAttr:$packed_sequences);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name `version` `(` $version `)` `head_dim` `(` $head_dim `)` `block_q` `(` $block_q `)`
    `block_kv` `(` $block_kv `)` (`packed_sequences` $packed_sequences^)? attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
}

def Sage_InputOp : Sage_ValueOp<"input"> {
  let summary = "the caller's Q, K or V tensor";
  let arguments = (ins Sage_TensorRoleAttr:$role);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "`` $role attr-dict";
}

def Sage_SmoothOp : Sage_ValueOp<"smooth"> {
  let summary = "subtract the token mean (gamma(K) = K - mean(K))";
  let arguments = (ins Sage_TileType:$input, Sage_SmoothScopeAttr:$scope);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `over` `` $scope attr-dict";
}

def Sage_QuantizeOp : Sage_ValueOp<"quantize"> {
  let summary = "quantize (or cast) a tensor: the paper's psi";
  let description = [{
    `group_tokens` is the number of tokens sharing a scale for per_block, per_warp and per_thread.
    `static_scale` fixes the scale (P's 1/127). `two_level` adds a per-row f32 scale on top of
    microscales. `fold_softmax_scale` multiplies Q by 1/sqrt(d) * log2(e) before quantizing it.
    `rotation_seed` (Q and K, both with the same seed, or neither) rotates each token along head_dim by a
    randomized Hadamard transform, its signs drawn from the seed, before quantizing it: (Q R_Q)(K R_K)^T
    = Q K^T in exact arithmetic, and an outlier channel no longer sets its group's scale alone
    (sage/numerics/Hadamard.h defines it bit for bit).
  }];
  let arguments = (ins Sage_TileType:$input, Sage_ElementTypeAttr:$dtype, Sage_GranularityAttr:$granularity,
                       DefaultValuedAttr<I64Attr, "0">:$group_tokens,
                       DefaultValuedAttr<Sage_ScaleTypeAttr, "::sage::ir::ScaleType::f32">:$scale_type,
                       OptionalAttr<F64Attr>:$static_scale, UnitAttr:$two_level, UnitAttr:$fold_softmax_scale,
                       OptionalAttr<I64Attr>:$rotation_seed);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `to` `` $dtype `` $granularity attr-dict";
}

def Sage_MmaOp : Sage_ValueOp<"mma"> {
  let summary = "a tensor-core matrix product with its accumulator type";
  let arguments = (ins Sage_TileType:$lhs, Sage_TileType:$rhs, Sage_AccumulatorTypeAttr:$accumulator);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$lhs `,` $rhs `->` `` $accumulator attr-dict";
}

def Sage_DecodeOp : Sage_ValueOp<"decode"> {
  let summary = "widen quantized codes into a type the target's mma takes, exactly (legalization)";
  let description = [{
    Written by the legalization pass for targets without the quantized mma. e2m1 codes times their
    microscales become f16 (NVFP4: an E2M1 value times a UE4M3 scale has at most 5 significant bits and
    lies in [2^-10, 2688]) or bf16 (MXFP4: a power-of-two scale), int4 codes become int8 codes. The
    microscales lie along the reduction axis and are folded into the values; every other scale (per
    token, per channel, P's per-row two-level scale) stays with sage.dequant after the mma.
  }];
  let arguments = (ins Sage_TileType:$input, Sage_ElementTypeAttr:$dtype);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `to` `` $dtype attr-dict";
}

def Sage_QMeanCorrectionOp : Sage_ValueOp<"q_mean_correction"> {
  let summary = "S += mean(Q_i) . K_j^T: the GEMV that restores Q smoothing (SageAttention2/3)";
  let description = [{
    With Q smoothed per Q block, the mma multiplies Q_i - mean(Q_i); adding the GEMV of the block's
    mean with the (smoothed, unquantized) K restores the scores: S = psi^-1(Q^ K^^T) + mean(Q_i) K_j^T
    (SageAttention3's Algorithm 1, line 8). Operands: the dequantized scores, the sage.smooth of Q
    whose block means are used, and K as it enters its quantizer.
  }];
  let arguments = (ins Sage_TileType:$input, Sage_TileType:$q_smoothed, Sage_TileType:$k);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `,` `mean` `(` $q_smoothed `)` `,` $k attr-dict";
}

def Sage_DequantOp : Sage_ValueOp<"dequant"> {
  let summary = "multiply an mma result by the scales of its operands (psi^-1)";
  let arguments = (ins Sage_TileType:$input);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input attr-dict";
}

def Sage_MaskOp : Sage_ValueOp<"mask"> {
  let summary = "mask scores: none, causal (bottom-right aligned) or block-sparse";
  let arguments = (ins Sage_TileType:$input, Sage_MaskKindAttr:$kind);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `` $kind attr-dict";
}

def Sage_OnlineSoftmaxOp : Sage_ValueOp<"online_softmax"> {
  let summary = "FlashAttention's online softmax: running max m, running sum l, P~ = exp(S - m)";
  let arguments = (ins Sage_TileType:$input, Sage_SoftmaxBaseAttr:$base, Sage_ElementTypeAttr:$state);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `` $base `state` `` $state attr-dict";
}

def Sage_AccumulateOp : Sage_ValueOp<"accumulate"> {
  let summary = "accumulate P.V across KV blocks: O_i^j = diag(exp(m^{j-1} - m^j)) O_i^{j-1} + P~ V";
  let arguments = (ins Sage_TileType:$input, Sage_AccumulationKindAttr:$kind,
                       DefaultValuedAttr<I64Attr, "0">:$flush_period);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `as` `` $kind attr-dict";
}

def Sage_NormalizeOp : Sage_ValueOp<"normalize"> {
  let summary = "O = diag(l)^-1 O, plus mean(V) when V was smoothed";
  let arguments = (ins Sage_TileType:$input, Sage_TileType:$softmax);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `by` $softmax attr-dict";
}

def Sage_WriteOOp : Sage_Op<"write_o"> {
  let summary = "write O in the input's dtype";
  let arguments = (ins Sage_TileType:$input);
  let assemblyFormat = "$input attr-dict";
}

def Sage_WriteLseOp : Sage_Op<"write_lse"> {
  let summary = "write the natural-log LSE of each query row";
  let description = [{
    With `smoothing_correction`, q . mean(K) / sqrt(d) is added back so the LSE is that of the
    unsmoothed logits (required when K is smoothed).
  }];
  let arguments = (ins Sage_TileType:$softmax, UnitAttr:$smoothing_correction);
  let assemblyFormat = "$softmax attr-dict";
}

// SLA (issue 13): its own file.
include "SlaOps.td"
// SageBwd (issue 12): the backward program's ops.
include "SageBackwardOps.td"

#endif // SAGE_OPS_TD
