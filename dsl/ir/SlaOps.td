// SLA (sparse-linear attention, issue 13): mask prediction, the linear branch and the combined output.
// Included at the end of SageOps.td; kept in its own file so other additions to the dialect merge cleanly.
//
// An SLA program is an ordinary block_sparse attention program (its sparse part: the critical blocks, computed
// exactly or with SageAttention's quantizers) plus these three ops:
//   %classes = sage.predict_mask %q, %k critical(5.0) negligible(10.0)   M_c from P_c = softmax(pool(Q) pool(K)^T/sqrt(d))
//   %o_linear = sage.linear_branch %q, %k, %v over %classes phi softmax  O^l over the marginal blocks
//   %o_sla = sage.sla_combine %o, proj(%o_linear)                        O = O^s + Proj(O^l)
// The block_sparse sage.mask of such a program keeps exactly the blocks that %classes marks critical.
#ifndef SAGE_SLA_OPS_TD
#define SAGE_SLA_OPS_TD

def Sage_FeatureMap : Sage_Enum<"FeatureMap", "feature map phi of SLA's linear branch", [
  I32EnumAttrCase<"softmax", 0>, I32EnumAttrCase<"elu_plus_one", 1>, I32EnumAttrCase<"relu", 2>]>;
def Sage_FeatureMapAttr : EnumAttr<Sage_Dialect, Sage_FeatureMap, "feature_map">;

def Sage_PredictMaskOp : Sage_ValueOp<"predict_mask"> {
  let summary = "SLA's compressed mask M_c: critical / marginal / negligible per (q block, kv block)";
  let description = [{
    P_c = softmax(pool(Q) pool(K)^T / sqrt(d)), pool the mean over the attention's block_q (Q) and block_kv (K)
    tokens. Per row of P_c the top `critical_percent` (k_h) of the blocks are critical, the bottom
    `negligible_percent` (k_l) negligible, the rest marginal (counts: sage/ir/SlaSpec.h). Ranks are by P_c
    descending, ties by the lower kv block first, so the classes are deterministic.
  }];
  let arguments = (ins Sage_TileType:$q, Sage_TileType:$k, F64Attr:$critical_percent, F64Attr:$negligible_percent);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = [{
    $q `,` $k `critical` `(` $critical_percent `)` `negligible` `(` $negligible_percent `)` attr-dict
  }];
}

def Sage_LinearBranchOp : Sage_ValueOp<"linear_branch"> {
  let summary = "SLA's linear attention over the marginal blocks: O^l_i = phi(Q_i) H_i / (phi(Q_i) Z_i)";
  let description = [{
    H_i = sum of phi(K_j)^T V_j and Z_i = sum of colsum(phi(K_j)) over the kv blocks j that M_c marks marginal in
    q block i. phi is applied to each token's row of the caller's Q and K (before any smoothing or quantization);
    a row whose denominator is 0 (no marginal block) gets O^l = 0.
  }];
  let arguments = (ins Sage_TileType:$q, Sage_TileType:$k, Sage_TileType:$v, Sage_TileType:$classes,
                       Sage_FeatureMapAttr:$feature_map);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$q `,` $k `,` $v `over` $classes `phi` `` $feature_map attr-dict";
}

def Sage_SlaCombineOp : Sage_ValueOp<"sla_combine"> {
  let summary = "SLA's output O = O^s + Proj(O^l), Proj the caller's d x d linear map (with bias)";
  let arguments = (ins Sage_TileType:$sparse, Sage_TileType:$linear);
  let results = (outs Sage_TileType:$result);
  let assemblyFormat = "$sparse `,` `proj` `(` $linear `)` attr-dict";
}

#endif // SAGE_SLA_OPS_TD
