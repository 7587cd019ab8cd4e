// The PTX emitters: instruction spellings, operand lists and constraints of each wrapper.
#include "sage/codegen/PtxEmitters.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

using namespace sage;
using namespace sage::codegen;
using schedules::MmaShape;

namespace {

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

int occurrences(const std::string &text, const std::string &part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++count;
  return count;
}

bool balanced(const std::string &text) {
  return std::count(text.begin(), text.end(), '{') == std::count(text.begin(), text.end(), '}') &&
         std::count(text.begin(), text.end(), '(') == std::count(text.begin(), text.end(), ')');
}

} // namespace

TEST_CASE("mma.sync instructions are spelled as the PTX ISA lists them") {
  CHECK(mmaInstruction({16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32}) ==
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32");
  CHECK(mmaInstruction({16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16}) ==
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16");
  CHECK(mmaInstruction({16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32}) ==
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32");
  CHECK(mmaInstruction({16, 8, 16, ElementType::bf16, ElementType::bf16, AccumulatorType::f32}) ==
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
  CHECK(mmaInstruction({16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32}) ==
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32");
  CHECK(mmaFunctionName({16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32}) ==
        "mma_m16n8k32_s8_s32");
}

TEST_CASE("mma wrappers: 4 accumulators, 4 A and 2 B registers; C aliases D") {
  const std::string s8 = emitMmaFunction({16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32});
  CHECK(contains(s8, "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}"));
  CHECK(occurrences(s8, "\"+r\"(accumulator[") == 4);
  CHECK(occurrences(s8, "\"r\"(a[") == 4);
  CHECK(occurrences(s8, "\"r\"(b") == 2);
  CHECK(contains(s8, "int (&accumulator)[4]"));
  CHECK(balanced(s8));

  const std::string f32 = emitMmaFunction({16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32});
  CHECK(occurrences(f32, "\"+f\"(accumulator[") == 4);
  CHECK(contains(f32, "float (&accumulator)[4]"));

  const std::string f16 = emitMmaFunction({16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16});
  CHECK(contains(f16, "{%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1}"));
  CHECK(occurrences(f16, "\"+r\"(accumulator[") == 2);
  CHECK(contains(f16, "unsigned (&accumulator)[2]"));

  const std::string e4m3 = emitMmaFunction({16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32});
  CHECK(contains(e4m3, "f32.e4m3.e4m3.f32"));
  CHECK(occurrences(e4m3, "\"+f\"(accumulator[") == 4);
}

TEST_CASE("unsupported mma shapes are rejected") {
  CHECK_THROWS_AS(mmaInstruction({16, 8, 16, ElementType::int8, ElementType::int8, AccumulatorType::s32}),
                  std::invalid_argument);
  CHECK_THROWS_AS(mmaInstruction({16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::s32}),
                  std::invalid_argument);
  CHECK_THROWS_AS(mmaInstruction({16, 8, 16, ElementType::bf16, ElementType::bf16, AccumulatorType::f16}),
                  std::invalid_argument);
  CHECK_THROWS_AS(emitMmaFunction({16, 8, 16, ElementType::f32, ElementType::f32, AccumulatorType::f32}),
                  std::invalid_argument);
}

TEST_CASE("ldmatrix wrappers: one register per matrix, .trans on request") {
  CHECK(ldmatrixInstruction(4, false) == "ldmatrix.sync.aligned.m8n8.x4.shared.b16");
  CHECK(ldmatrixInstruction(2, true) == "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16");
  CHECK(ldmatrixFunctionName(4, true) == "ldmatrix_x4_trans");
  const std::string x4 = emitLdmatrixFunction(4, true);
  CHECK(contains(x4, "{%0, %1, %2, %3}, [%4]"));
  CHECK(occurrences(x4, "\"=r\"(fragment[") == 4);
  CHECK(contains(x4, "asm volatile"));
  const std::string x1 = emitLdmatrixFunction(1, false);
  CHECK(contains(x1, "{%0}, [%1]"));
  CHECK(balanced(x1));
  CHECK_THROWS_AS(emitLdmatrixFunction(3, false), std::invalid_argument);
}

TEST_CASE("cp.async wrappers: 16-byte zero-filling copy, 4-byte copy, commit and wait") {
  const std::string copy16 = emitCpAsyncCopy16Function();
  CHECK(contains(copy16, "cp.async.cg.shared.global [%0], [%1], 16, %2;"));
  CHECK(contains(copy16, "fill ? 16 : 0"));
  CHECK(contains(emitCpAsyncCopy4Function(), "cp.async.ca.shared.global [%0], [%1], 4;"));
  CHECK(contains(emitCpAsyncCommitFunction(), "cp.async.commit_group;"));
  const std::string wait = emitCpAsyncWaitFunction();
  CHECK(contains(wait, "cp.async.wait_group %0;"));
  CHECK(contains(wait, "\"n\"(kPending)"));
  CHECK(contains(wait, "\"memory\""));
}

TEST_CASE("special functions and conversions") {
  CHECK(contains(emitExp2Function(), "ex2.approx.ftz.f32 %0, %1;"));
  CHECK(contains(emitLog2Function(), "lg2.approx.ftz.f32 %0, %1;"));
  // cvt.rn.f16x2.f32 d, a, b puts a in the upper half: the wrapper passes (high, low)
  const std::string f16 = emitPackF16x2Function();
  CHECK(contains(f16, "cvt.rn.f16x2.f32 %0, %1, %2;"));
  CHECK(contains(f16, ": \"f\"(high), \"f\"(low)"));
  CHECK(contains(emitPackBf16x2Function(), "cvt.rn.bf16x2.f32 %0, %1, %2;"));
  CHECK(contains(emitUnpackF16x2Function(), "cvt.f32.f16"));
  CHECK(contains(emitScaleF16x2Function(), "mul.rn.f16x2"));
  const std::string s8 = emitPackS8x4Function();
  CHECK(occurrences(s8, "cvt.rni.s32.f32") == 4);
  CHECK(occurrences(s8, "cvt.pack.sat.s8.s32.b32") == 2);
  const std::string e4m3 = emitPackE4m3x4Function();
  CHECK(occurrences(e4m3, "cvt.rn.satfinite.e4m3x2.f32") == 2);
  for (const std::string &text : {f16, s8, e4m3, emitUnpackF16x2Function()})
    CHECK(balanced(text));
}
