sage.attention @"sage-b" version(1) head_dim(128) block_q(128) block_kv(64) {
  %q = sage.input q
  %k = sage.input k
  %v = sage.input v
  %k_smoothed = sage.smooth %k over sequence
  %q_int8 = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64, rotation_seed = 7 : i64}
  %k_int8 = sage.quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64, rotation_seed = 7 : i64}
  %s = sage.mma %q_int8, %k_int8 -> s32
  %s_dequant = sage.dequant %s
  %p = sage.online_softmax %s_dequant exp2 state f32
  %p_f16 = sage.quantize %p to f16 none
  %v_f16 = sage.quantize %v to f16 none
  %pv = sage.mma %p_f16, %v_f16 -> f16
  %o_accumulated = sage.accumulate %pv as f16
  %o = sage.normalize %o_accumulated by %p
  sage.write_o %o
}
