%a = sage.bwd_row_dot %do, %o
sage.attention_backward @sagebwd version(1) head_dim(64) block_q(64) block_kv(64) {
  %do = sage.bwd_input do
  %o = sage.bwd_input o
  garbage
