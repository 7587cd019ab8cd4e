// sagegen for C++ applications: describe a variant with the DSL, run it with the runtime.
//
//   sage::ir::Program program = sage::dsl::preset("sage-b", 128, sage::MaskKind::causal)->build();
//   sage::runtime::AttentionRunnerOptions options;
//   options.ir_fingerprint = program.fingerprint();
//   options.aot_directory = "kernels/";  // optional: cubins from `sagegen emit` (default: $SAGEGEN_AOT_DIR)
//   sage::runtime::AttentionRunner runner(program.variant(), options);   // AOT cubin, cache hit, or JIT
//   runner.run(shape, tensors, workspace, runner.workspaceBytes(shape), stream);
//
// examples/dsl_attention_example.cpp is a complete program. For other languages see sage/sage_c.h.
#pragma once

#include "sage/dsl/Attention.h"
#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"
#include "sage/runtime/AttentionRunner.h"
