sage.attention_backward @sagebwd version(1) head_dim(64) block_q(64) block_kv(64) {
  %q = sage.bwd_input q
  %k = sage.bwd_input k
  %v = sage.bwd_input v
  %o = sage.bwd_input o
  %lse = sage.bwd_input lse
  %do = sage.bwd_input do
  %delta = sage.bwd_row_dot %do, %o
  %q_int8 = sage.bwd_quantize 