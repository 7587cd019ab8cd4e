sage.attention_backward @"exact-bwd" version(1) head_dim(64) block_q(64) block_kv(64) {
  %q = sage.bwd_input q
  %k = sage.bwd_input k
  %v = sage.bwd_input v
  %o = sage.bwd_input o
  %lse = sage.bwd_input lse
  %do = sage.bwd_input do
  %delta = sage.bwd_row_dot %do, %o
  %q_f32 = sage.bwd_quantize %q to f32 none
  %k_f32 = sage.bwd_quantize %k to f32 none
  %s = sage.bwd_mma %q_f32, %k_f32 -> f32
  %p = sage.bwd_recompute_p %s, %lse
  %p_f32 = sage.bwd_quantize %p to f32 none
  %do_f32 = sage.bwd_quantize %do to f32 none
  %dv = sage.bwd_mma %p_f32, %do_f32 -> f32
  %v_f32 = sage.bwd_quantize %v to f32 none
  %dp = sage.bwd_mma %do_f32, %v_f32 -> f32
  %ds = sage.bwd_ds %p, %dp, %delta
  %ds_f32 = sage.bwd_quantize %ds to f32 none
  %dq = sage.bwd_mma %ds_f32, %k_f32 -> f32
  %dk = sage.bwd_mma %ds_f32, %q_f32 -> f32
  sage.bwd_write_grad %dq as f32
  sage.bwd_write_grad %dk as f32
  sage.bwd_write_grad %dv as f32
}
