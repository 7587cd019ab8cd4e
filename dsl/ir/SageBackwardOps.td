// SageBwd (issue 12): the ops of the `sage.attention_backward` program, SageAttention3's Algorithm 3.
// Included at the end of SageOps.td; kept in its own file so other issues' additions to SageOps.td merge cleanly.
#ifndef SAGE_BACKWARD_OPS_TD
#define SAGE_BACKWARD_OPS_TD

// `do` is a C++ keyword: the enumerator is d_o, the keyword `do`.
def Sage_BackwardRole : Sage_Enum<"BackwardRole", "input of the backward pass", [
  I32EnumAttrCase<"q", 0>, I32EnumAttrCase<"k", 1>, I32EnumAttrCase<"v", 2>, I32EnumAttrCase<"o", 3>,
  I32EnumAttrCase<"lse", 4>, I32EnumAttrCase<"d_o", 5, "do">]>;
def Sage_BackwardRoleAttr : EnumAttr<Sage_Dialect, Sage_BackwardRole, "backward_role">;

// Every op of the backward program lives in a sage.attention_backward and names its result after the step.
class Sage_BackwardValueOp<string mnemonic>
    : Sage_Op<mnemonic, [HasParent<"AttentionBackwardOp">,
                         DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]>;

def Sage_AttentionBackwardOp : Sage_Op<"attention_backward", [IsolatedFromAbove, NoTerminator, SingleBlock, Symbol]> {
  let summary = "the backward pass of one attention variant: dQ, dK, dV from dO";
  let description = [{
    Attributes as sage.attention's: `block_q` and `block_kv` are the tiles (b_q, b_kv) of the FlashAttention-2
    style backward; a P or dS tile is b_q x b_kv, and per_block scales of Q/dO (K/V) cover b_q (b_kv) tokens.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, I64Attr:$version, I64Attr:$head_dim, I64Attr:$block_q,
                       I64Attr:$block_kv);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name `version` `(` $version `)` `head_dim` `(` $head_dim `)` `block_q` `(` $block_q `)`
    `block_kv` `(` $block_kv `)` attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
}

def Sage_BwdInputOp : Sage_BackwardValueOp<"bwd_input"> {
  let summary = "a tensor the backward reads: Q, K, V, the forward's O and natural-log LSE, the incoming dO";
  let arguments = (ins Sage_BackwardRoleAttr:$role);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "`` $role attr-dict";
}

def Sage_BwdSmoothOp : Sage_BackwardValueOp<"bwd_smooth"> {
  let summary = "K - mean(K) over the sequence, per KV head: the K that S and dQ quantize (SageAttention's gamma)";
  let description = [{
    K carries large per-channel offsets shared by its tokens (SageAttention's challenge C1); quantized per block,
    the offsets take the int8 range from the token-wise signal. Subtracting the token mean changes no score by
    more than a per-row constant: S_s = Q (K - mean(K))^T = S - q . mean(K), so P is recomputed from S_s with the
    LSE shifted to match (sage.bwd_recompute_p's `smoothing_shift`), and dQ = dS (K - mean(K)) = dS K because
    every row of dS sums to zero. dK = dS^T Q does not involve K. Only `sequence` (one mean per KV head).
  }];
  let arguments = (ins Sage_TileType:$input, Sage_SmoothScopeAttr:$scope);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `over` `` $scope attr-dict";
}

def Sage_BwdRowDotOp : Sage_BackwardValueOp<"bwd_row_dot"> {
  let summary = "D = rowsum(dO o O), one value per query row (Algorithm 3, line 2)";
  let arguments = (ins Sage_TileType:$grad_output, Sage_TileType:$output);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$grad_output `,` $output attr-dict";
}

def Sage_BwdQuantizeOp : Sage_BackwardValueOp<"bwd_quantize"> {
  let summary = "psi of the backward: int8 per_token / per_block, or a cast (f16, bf16, f32)";
  let description = [{
    Q and dO groups are `group_tokens` query tokens, K and V groups key tokens. P and dS (group_tokens stays 0)
    take one scale per b_q x b_kv tile (per_block), or one per token of their product's output (per_token: per key
    for dV = P^T.dO and dK = dS^T.Q, per query for dQ = dS.K), the axis the product does not sum over, so that the
    scales factor out of its sum; per_token dS then needs one quantizer for dQ and another for dK.
    `rotation_seed` (issue 25; the forward's sage.quantize attribute, sage/numerics/Hadamard.h) rotates each token
    of Q (by R_Q) or K (by R_K) along head_dim before quantizing it. Every quantizer of Q and K carries the same
    seed, or none: S = (Q R_Q)(K R_K)^T is exact, and dQ = dS (K R_K) R_K^-1, dK = dS^T (Q R_Q) R_Q^-1 are
    computed in the rotated basis and rotated back after their sums.
  }];
  let arguments = (ins Sage_TileType:$input, Sage_ElementTypeAttr:$dtype, Sage_GranularityAttr:$granularity,
                       DefaultValuedAttr<I64Attr, "0">:$group_tokens, OptionalAttr<I64Attr>:$rotation_seed);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `to` `` $dtype `` $granularity attr-dict";
}

def Sage_BwdMmaOp : Sage_BackwardValueOp<"bwd_mma"> {
  let summary = "one of the five products, dequantized by its operands' scales";
  let description = [{
    What it computes follows from its operands: Q,K -> S = Q.K^T; dO,V -> dP = dO.V^T; P,dO -> dV = P^T.dO;
    dS,K -> dQ = dS.K; dS,Q -> dK = dS^T.Q. The result is the f32 product times both operands' scales.
  }];
  let arguments = (ins Sage_TileType:$lhs, Sage_TileType:$rhs, Sage_AccumulatorTypeAttr:$accumulator);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$lhs `,` $rhs `->` `` $accumulator attr-dict";
}

def Sage_BwdMaskOp : Sage_BackwardValueOp<"bwd_mask"> {
  let summary = "mask the recomputed scores as the forward did (none or causal, bottom-right aligned)";
  let arguments = (ins Sage_TileType:$input, Sage_MaskKindAttr:$kind);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$input `` $kind attr-dict";
}

def Sage_BwdRecomputePOp : Sage_BackwardValueOp<"bwd_recompute_p"> {
  let summary = "P = exp(S / sqrt(d) - LSE): the forward's probabilities, from its natural-log LSE";
  let description = [{
    The LSE is the forward's, of the unsmoothed scores. With `smoothing_shift` (required exactly when S is
    recomputed from a sage.bwd_smooth of K) each row's LSE is first shifted by the term smoothing took out of its
    scores: P = exp(S_s / sqrt(d) - (LSE - q . mean(K) / sqrt(d))), q the caller's unquantized query row.
  }];
  let arguments = (ins Sage_TileType:$scores, Sage_TileType:$lse, UnitAttr:$smoothing_shift);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$scores `,` $lse attr-dict";
}

def Sage_BwdDsOp : Sage_BackwardValueOp<"bwd_ds"> {
  let summary = "dS = P o (dP - D) (Algorithm 3, line 9), from the unquantized P";
  let arguments = (ins Sage_TileType:$p, Sage_TileType:$dp, Sage_TileType:$delta);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$p `,` $dp `,` $delta attr-dict";
}

def Sage_BwdWriteGradOp : Sage_Op<"bwd_write_grad", [HasParent<"AttentionBackwardOp">]> {
  let summary = "accumulate dQ, dK or dV over the tiles (GQA: over a group's query heads) and write it";
  let description = [{
    dQ and dK are multiplied by the softmax scale 1/sqrt(d) (the scores' gradient is with respect to
    S / sqrt(d)); the accumulation is f32.
  }];
  let arguments = (ins Sage_TileType:$input, Sage_AccumulationKindAttr:$accumulation);
  let assemblyFormat = "$input `as` `` $accumulation attr-dict";
}

#endif // SAGE_BACKWARD_OPS_TD
