/* Uses the installed C ABI: its version, and an attention created on device 0 (a CUDA error without a GPU). */
#include <sage/sage_c.h>

#include <stdio.h>

int main(void) {
  if (sage_abi_version() != SAGE_ABI_VERSION) {
    printf("ABI version %d, header %d\n", sage_abi_version(), SAGE_ABI_VERSION);
    return 1;
  }
  sage_attention_config config = {0};
  config.preset = "sage-b";
  config.head_dim = 64;
  config.dtype = SAGE_DTYPE_F16;
  sage_attention_t attention = NULL;
  sage_status status = sage_attention_create(&config, &attention);
  printf("sagegen %s, ABI %d: create -> %d (%s)\n", sage_version(), sage_abi_version(), (int)status,
         status == SAGE_OK ? "ok" : sage_last_error());
  sage_attention_destroy(attention);
  return status == SAGE_OK || status == SAGE_CUDA_ERROR ? 0 : 1;
}
