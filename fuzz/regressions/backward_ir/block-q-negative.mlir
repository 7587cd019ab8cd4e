sage.attention_backward @sagebwd version(1) head_dim(64) block_q(-64) block_kv(64) {
  %q = sage.bwd_input q
  %k = sage.bwd_input k
  %v = sage.bwd_input v
  %o = sage.bwd_input o
  %lse = sage.bwd_input lse
  %do = sage.bwd_input do
  %delta = sage.bwd_row_dot %do, %o
  %q_int8 = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64}
  %k_int8 = sage.bwd_quantize %k to int8 per_block {group_tokens = 64 : i64}
  %s = sage.bwd_mma %q_int8, %k_int8 -> s32
  %p = sage.bwd_recompute_p %s, %lse
  %p_int8 = sage.bwd_quantize %p to int8 per_block
  %do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 64 : i64}
  %dv = sage.bwd_mma %p_int8, %do_int8 -> s32
  %do_f16 = sage.bwd_quantize %do to f16 none
  %v_f16 = sage.bwd_quantize %v to f16 none
  %dp = sage.bwd_mma %do_f16, %v_f16 -> f32
  %ds = sage.bwd_ds %p, %dp, %delta
  %ds_int8 = sage.bwd_quantize %ds to int8 per_block
  %dq = sage.bwd_mma %ds_int8, %k_int8 -> s32
  %dk = sage.bwd_mma %ds_int8, %q_int8 -> s32
  sage.bwd_write_grad %dq as f32
  sage.bwd_write_grad %dk as f32
  sage.bwd_write_grad %dv as f32
}
