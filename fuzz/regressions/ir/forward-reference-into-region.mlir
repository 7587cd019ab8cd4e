%a = sage.dequant %b
sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) {
  %b = sage.input q
  garbage
