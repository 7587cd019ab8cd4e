sage.attention @exact version(1) head_dim(128) block_q(128) block_kv(64) {
  %q = sage.input q
  %k = sage.input k
  %v = sage.input v
  %q_f32 = sage.quantize %q to f32 none
  %k_f32 = sage.quantize %k to f32 none
  %s = sage.mma %q_f32, %k_f32 -> f32
  %p = sage.online_softmax %s exp2 state f32
  %p_f32 = sage.quantize %p to f32 none
  %v_f32 = sage.quantize %v to f32 none
  %pv = sage.mma %p_f32, %v_f32 -> f32
  %o_accumulated = sage.accumulate %pv as f32
  %o = sage.normalize %o_accumulated by %p
  sage.write_o %o
}
