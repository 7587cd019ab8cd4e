// The vocabulary's names are the dialect's keywords, and they round-trip.
#include "sage/ir/AttentionVariant.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage;

TEST_CASE("enum names round-trip") {
  for (ElementType type : {ElementType::f32, ElementType::f16, ElementType::bf16, ElementType::int8, ElementType::int4,
                           ElementType::e4m3, ElementType::e5m2, ElementType::e2m1})
    CHECK((parseElementType(nameOf(type)) == type));
  for (Granularity granularity :
       {Granularity::none, Granularity::per_tensor, Granularity::per_token, Granularity::per_block,
        Granularity::per_warp, Granularity::per_thread, Granularity::per_channel, Granularity::microscale_1x16})
    CHECK((parseGranularity(nameOf(granularity)) == granularity));
  for (AccumulationKind kind :
       {AccumulationKind::f32, AccumulationKind::f16, AccumulationKind::f16_then_f32, AccumulationKind::f32_two_level})
    CHECK((parseAccumulationKind(nameOf(kind)) == kind));
  CHECK_FALSE(parseElementType("int9").has_value());
  CHECK(std::string(nameOf(MaskKind::block_sparse)) == "block_sparse");
}

TEST_CASE("element sizes") {
  CHECK(bitsOf(ElementType::int8) == 8);
  CHECK(bitsOf(ElementType::e2m1) == 4);
  CHECK(bitsOf(ElementType::bf16) == 16);
  CHECK(isInteger(ElementType::int4));
  CHECK_FALSE(isInteger(ElementType::e4m3));
  CHECK(isFloat8(ElementType::e5m2));
}
