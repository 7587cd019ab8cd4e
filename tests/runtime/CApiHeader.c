/* sage_c.h and sage_merge_c.h are C: this file compiles them as C (C ABI test). */
#include "sage/sage_c.h"
#include "sage/sage_merge_c.h"

int sage_test_header_abi_version(void) { return SAGE_ABI_VERSION; }
