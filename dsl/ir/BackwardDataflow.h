// What a tile of the backward program is (Q, dO, P, dS, the dV product, ...): the backward verifiers, names and
// extraction ask by walking producers back through sage.bwd_quantize, sage.bwd_smooth and sage.bwd_mask, to earlier ops
// only.
#pragma once

#include "sage/ir/BackwardVariant.h"
#include "sage/ir/Dialect.h"

#include <optional>

namespace sage::ir::backward {

enum class Origin { q, k, v, o, lse, d_o, s, p, dp, delta, ds, dv, dq, dk, unknown };

const char *originName(Origin origin);

Origin originOf(mlir::Value value);

// The product whose operands have these origins (Q,K -> s; dO,V -> dp; P,dO -> dv; dS,K -> dq; dS,Q -> dk).
std::optional<BackwardProduct> productOf(Origin lhs, Origin rhs);
// The origin of a product's result (s -> Origin::s, ...).
Origin resultOrigin(BackwardProduct product);

// The sage.bwd_mma of a value (its producer), its product if its operands name one.
std::optional<BackwardProduct> productOf(BwdMmaOp mma);

} // namespace sage::ir::backward
