sage.attention_backward @a version(1) head_dim(64) block_q(64) block_kv(64) {
  %do = sage.bwd_input do
}
%delta = sage.bwd_row_dot %do, %do
sage.attention_backward @b version(1) head_dim(64) block_q(64) block_kv(64) {
  %do = sage.bwd_input do
  garbage
