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

# tune: the sweep itself needs a GPU (its logic is tested with a fake timer in runtime_tuning_sweep_test); here the
# arguments, the database display and corrupt databases.
export SAGEGEN_TUNING_DB="$work/tuning.json"
expect "tune needs --n" 1 "--n: give at least one sequence length" -- "$sagegen" tune --preset sage-b
expect "tune needs --preset" 1 "--preset: name the preset to tune" -- "$sagegen" tune --n 1024
expect "tune bad --input" 1 "--input: expected f16 or bf16, got 'f8'" -- "$sagegen" tune --preset sage-b --n 1024 --input f8
expect "tune bad --batch-heads" 1 "--batch-heads: expected BATCHxHEADS" -- "$sagegen" tune --preset sage-b --n 1024 --batch-heads 4by8
expect "tune bad --n" 1 "--n: expected positive sequence lengths, got -5" -- "$sagegen" tune --preset sage-b --n -5
expect "tune unknown preset" 1 "--preset: unknown preset 'sage-x'" -- "$sagegen" tune --preset sage-x --n 1024
if [[ -z "$(command -v nvidia-smi)" ]]; then
  expect "tune without a GPU says so" 1 "tune measures kernels on a GPU, and there is none" -- "$sagegen" tune --preset sage-b --n 1024
fi
expect "tune --show of no database" 0 "tuning\.json: no entries" -- "$sagegen" tune --show
cat >"$work/tuning.json" <<'JSON'
{"format": "sagegen-tuning-db", "version": 1, "devices": [
  {"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90a", "sagegen_version": "0.1.0", "entries": [
    {"variant": "sage-b", "head_dim": 128, "causal": true, "input": "f16", "tokens": 4096,
     "tunables": "block_q=128,block_kv=64,warps=8,stages=4", "milliseconds": 1.5, "default_milliseconds": 1.8,
     "date": "2026-11-23T11:00:00Z"}]}]}
JSON
expect "tune --show prints the entries" 0 "sage-b +128 +yes +f16 +4096  block_q=128,block_kv=64,warps=8,stages=4 +1\.5000 +1\.8000 +1\.200x" -- "$sagegen" tune --show
expect "tune --show names the GPU" 0 "NVIDIA H100 80GB HBM3 \(sm_90a, sagegen 0\.1\.0\)" -- "$sagegen" tune --show --db "$work/tuning.json"
printf '{"format": "sagegen-tuning-db",\n "version": 1,\n "devices": [}\n' >"$work/corrupt.json"
expect "tune --show of a corrupt database" 1 "--db: .*corrupt\.json: line 3, column 14" -- "$sagegen" tune --show --db "$work/corrupt.json"
unset SAGEGEN_TUNING_DB

# select: small generated .npy samples (python3 standard library only). Layer "a" is N(0,1); layer "b" has a large
# per-channel bias in K (removed by K smoothing in every preset) plus two outlier K tokens (x30) that per-block scales cannot
# absorb, and sharper attention (Q x 4): the per-block candidates (sage-vb, sage-b) fall below 99.8%, the per-token
# ones do not.
mkdir -p "$work/samples"
python3 - "$work/samples" <<'PY'
import random, struct, sys
def save(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }" % shape
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))
H, N, D = 2, 128, 64
def layer(name, seed, q_scale, k_bias, outliers):
    rng = random.Random(seed)
    bias = [rng.gauss(0, k_bias) for _ in range(D)]
    special = set(rng.sample(range(N), outliers))
    save(f"{sys.argv[1]}/{name}.q.npy", (H, N, D), [rng.gauss(0, q_scale) for _ in range(H * N * D)])
    save(f"{sys.argv[1]}/{name}.k.npy", (H, N, D), [rng.gauss(0, 1) * (30 if t in special else 1) + bias[c]
                                                    for h in range(H) for t in range(N) for c in range(D)])
    save(f"{sys.argv[1]}/{name}.v.npy", (H, N, D), [rng.gauss(0, 1) for _ in range(H * N * D)])
layer("a", 5, 1.0, 0.0, 0)
layer("b", 1, 4.0, 30.0, 2)
PY
expect "select picks sage-vb for the calm layer" 0 "^a +128 +2 +64 +0\.99[0-9]+ .* sage-vb: the fastest of the 4 candidates" -- "$sagegen" select "$work/samples" -o "$work/choices.json" --db "$work/none.json"
expect "select picks sage-vt for the outlier layer" 0 "^b +128 +2 +64 +0\.98[0-9]+ +0\.999[0-9]+ .* sage-vt: the fastest of the 2 candidates" -- "$sagegen" select "$work/samples" -o "$work/choices.json" --db "$work/none.json"
expect "select writes the choices" 0 '"layer": "b",.*"preset": "sage-vt"' -- tr -d '\n' <"$work/choices.json"
expect "select records every candidate" 0 '"preset": "sage-t", *"cos_similarity": 0\.99' -- tr -d '\n' <"$work/choices.json"
expect "select falls back to exact" 0 "^b .* exact: no candidate reaches cos 0\.99995 \(best: sage-t at" -- "$sagegen" select "$work/samples" -o "$work/exact.json" --threshold 0.99995 --db "$work/none.json"
expect "select can fall back to the most accurate" 0 "^b .* sage-t: no candidate reaches cos 0\.99995: the most accurate" -- "$sagegen" select "$work/samples" -o "$work/best.json" --threshold 0.99995 --fallback most-accurate --db "$work/none.json"
printf '[{"layer": "only_b", "q": "samples/b.q.npy", "k": "samples/b.k.npy", "v": "samples/b.v.npy"}]' >"$work/layers.json"
expect "select reads a JSON list of layers" 0 "^only_b .* sage-t: the fastest of the 1 candidate with cos >= 0\.998" -- "$sagegen" select "$work/layers.json" -o "$work/list.json" --candidates sage-b,sage-t --db "$work/none.json"
expect "select names the paper's order" 0 "fastest first: paper \(SageAttention, section 4\.5" -- "$sagegen" select "$work/layers.json" -o "$work/list.json" --db "$work/none.json"
rm "$work/samples/b.v.npy"
expect "select: a layer without V" 1 "SAMPLES: layer 'b' has b\.q\.npy but no b\.v\.npy" -- "$sagegen" select "$work/samples" -o "$work/x.json"
expect "select: a bad threshold" 1 "--threshold: expected a cosine similarity in \(0, 1\]" -- "$sagegen" select "$work/samples" --threshold 2
expect "select: no samples" 1 "SAMPLES: no such file or directory" -- "$sagegen" select "$work/nowhere"
printf 'not numpy' >"$work/samples/a.k.npy"
rm "$work/samples/b.q.npy"
expect "select: a bad .npy" 1 "SAMPLES: .*a\.k\.npy" -- "$sagegen" select "$work/samples" -o "$work/x.json"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
