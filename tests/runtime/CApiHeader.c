/* sage_c.h is C: this file compiles it as C (C ABI test). */
#include "sage/sage_c.h"

int sage_test_header_abi_version(void) { return SAGE_ABI_VERSION; }
