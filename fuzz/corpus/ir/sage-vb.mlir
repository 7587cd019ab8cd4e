sage.attention @"sage-vb" version(1) head_dim(128) block_q(128) block_kv(64) {
  %q = sage.input q
  %k = sage.input k
  %v = sage.input v
  %k_smoothed = sage.smooth %k over sequence
  %q_int8 = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}
  %k_int8 = sage.quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}
  %s = sage.mma %q_int8, %k_int8 -> s32
  %s_dequant = sage.dequant %s
  %p = sage.online_softmax %s_dequant exp2 state f32
  %p_int8 = sage.quantize %p to int8 per_tensor {static_scale = 0.0078740157480314959 : f64}
  %v_int8 = sage.quantize %v to int8 per_channel
  %pv = sage.mma %p_int8, %v_int8 -> s32
  %pv_dequant = sage.dequant %pv
  %o_accumulated = sage.accumulate %pv_dequant as f32
  %o = sage.normalize %o_accumulated by %p
  sage.write_o %o
}
