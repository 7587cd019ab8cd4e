#!/usr/bin/env bash
# The sagegen command line: outputs, messages and exit codes (0 ok, 1 user error, 2 internal error).
set -u
sagegen=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# expect NAME EXIT_CODE REGEX -- COMMAND...: runs COMMAND, checks its exit code and that its output matches REGEX.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [[ $status -eq $code ]] && grep -Eq -- "$pattern" <<<"$output"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    printf 'FAILED %s: exit %s (expected %s), output:\n%s\n' "$name" "$status" "$code" "$output"
  fi
}

expect "list names every preset" 0 "sage-t.*" -- "$sagegen" list
expect "list has sage2-fp8" 0 "sage2-fp8" -- "$sagegen" list
expect "help" 0 "Subcommands" -- "$sagegen" --help
expect "ir prints the variant" 0 'sage.attention @"sage-b" version\(1\) head_dim\(64\)' -- "$sagegen" ir --preset sage-b --headdim 64
expect "ir with causal and lse" 0 "sage.write_lse %p \{smoothing_correction\}" -- "$sagegen" ir --preset sage-t --causal --lse
expect "ir unknown preset" 1 "--preset: unknown preset 'sage-x'; expected one of sage-t" -- "$sagegen" ir --preset sage-x
expect "ir bad head dim" 1 "head_dim: expected a positive multiple of 16" -- "$sagegen" ir --preset sage-b --headdim 100
expect "ir without --preset" 1 "preset is required" -- "$sagegen" ir
expect "unknown subcommand" 1 "" -- "$sagegen" frobnicate

"$sagegen" ir --preset sage-vb --lse >"$work/good.mlir"
expect "check accepts printed IR" 0 "good.mlir: ok \(sage.attention @sage-vb, IR version 1\)" -- "$sagegen" check "$work/good.mlir"
sed 's/-> s32/-> f16/' "$work/good.mlir" | head -n 8 >"$work/partial.mlir"
sed 's/%q_int8, %k_int8 -> s32/%q_int8, %k_int8 -> f16/' "$work/good.mlir" >"$work/bad.mlir"
expect "check reports the rule with file:line:col" 1 "bad.mlir:8:[0-9]+: error: 'sage.mma' op mma of int8 operands accumulates in s32" -- "$sagegen" check "$work/bad.mlir"
expect "check reports syntax errors" 1 "partial.mlir:[0-9]+:[0-9]+: error" -- "$sagegen" check "$work/partial.mlir"
expect "check of a missing file" 1 "FILE: cannot open" -- "$sagegen" check "$work/missing.mlir"

expect "reference prints the accuracy table" 0 "^sage-b +0\.999" -- "$sagegen" reference --preset sage-b --n 256 --headdim 64
expect "reference of an IR file" 0 "^sage-vb " -- "$sagegen" reference --ir "$work/good.mlir" --n 200 --kv-heads 1 --heads 2
expect "reference exact is exact" 0 "^exact +1\.000000 +0\.0000" -- "$sagegen" reference --preset exact --n 130 --headdim 32 --layout nhd --dtype bf16
expect "reference bad dtype" 1 "--dtype: expected f16, bf16 or f32, got 'f8'" -- "$sagegen" reference --dtype f8 --n 64
expect "reference bad GQA" 1 "--kv-heads: must divide --heads" -- "$sagegen" reference --heads 3 --kv-heads 2 --n 64

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
