#!/usr/bin/env bash
# The sagegen command line: outputs, messages and exit codes (0 ok, 1 user error, 2 internal error).
set -u
sagegen=$1
source "$(dirname "$0")/expect.sh"

expect "list names every preset" 0 "sage-t.*" -- "$sagegen" list
expect "list has sage2-fp8" 0 "sage2-fp8" -- "$sagegen" list
expect "help" 0 "Subcommands" -- "$sagegen" --help
expect "ir prints the variant" 0 'sage.attention @"sage-b" version\(1\) head_dim\(64\)' -- "$sagegen" ir --preset sage-b --headdim 64
expect "ir with causal and lse" 0 "sage.write_lse %p \{smoothing_correction\}" -- "$sagegen" ir --preset sage-t --causal --lse
expect "ir unknown preset" 1 "--preset: unknown preset 'sage-x'; expected one of sage-t" -- "$sagegen" ir --preset sage-x
expect "ir bad head dim" 1 "head_dim: expected a positive multiple of 16" -- "$sagegen" ir --preset sage-b --headdim 100
expect "ir without --preset" 1 "preset is required" -- "$sagegen" ir
expect "list has the reference-only presets" 0 "sage3-fp4 .*NVFP4" -- "$sagegen" list
expect "list has the SLA presets" 0 "sla-f16 .*SLA: predicted critical blocks" -- "$sagegen" list
expect "ir prints SLA's mask prediction" 0 "sage.predict_mask %q, %k critical" -- "$sagegen" ir --preset sla-f16 --headdim 64
expect "ir of sage3-fp4" 0 "sage.q_mean_correction %s_dequant, mean\(%q_smoothed\), %k_smoothed" -- "$sagegen" ir --preset sage3-fp4
expect "ir --legalize sm_90a decodes FP4" 0 "sage.mma %q_decoded_f16, %k_decoded_f16 -> f32" -- "$sagegen" ir --preset sage3-fp4 --legalize sm_90a
expect "ir --legalize sm_90a decodes INT4" 0 "sage.decode %q_int4 to int8" -- "$sagegen" ir --preset sage2-int4 --legalize sm_90a
expect "ir --legalize unknown target" 1 "--legalize: unknown target 'sm_75'" -- "$sagegen" ir --preset sage3-fp4 --legalize sm_75
"$sagegen" ir --preset sage3-fp4 --legalize sm_90a >"$work/legalized.mlir"
expect "check accepts legalized IR" 0 "legalized.mlir: ok \(sage.attention @sage3-fp4" -- "$sagegen" check "$work/legalized.mlir"
expect "reference runs the FP4 presets" 0 "sage3-fp4-direct-p" -- "$sagegen" reference --preset sage3-fp4,sage3-fp4-direct-p --n 128 --headdim 64 --q-bias 1
# SageBwd (issue 12): the backward program, its check, and the CPU reference of its gradients.
expect "list has the backward presets" 0 "sagebwd-int8-dp .*Table 1\(c\)" -- "$sagegen" list
expect "ir --backward prints the backward program" 0 "sage.bwd_mma %ds_int8, %k_int8 -> s32" -- "$sagegen" ir --backward --preset sagebwd --causal
expect "ir --backward unknown preset" 1 "unknown backward preset 'sage-b'; expected one of sagebwd" -- "$sagegen" ir --backward --preset sage-b
"$sagegen" ir --backward --preset sagebwd-int8-dp --headdim 64 >"$work/backward.mlir"
expect "check accepts a backward program" 0 "backward.mlir: ok \(sage.attention_backward @sagebwd-int8-dp" -- "$sagegen" check "$work/backward.mlir"
sed 's/%p, %dp, %delta/%p_int8, %dp, %delta/' "$work/backward.mlir" >"$work/bad_backward.mlir"
expect "check locates a backward error" 1 "bad_backward.mlir:[0-9]+:[0-9]+: error: .*takes the unquantized P" -- "$sagegen" check "$work/bad_backward.mlir"
expect "reference-backward prints the gradient table" 0 "^sagebwd-int8-dp +sagebwd +0\.9" -- "$sagegen" reference-backward --n 128 --headdim 64 --causal --heads 2 --kv-heads 1
expect "reference-backward --k-bias 8: K smoothing repairs dQ (issue 25)" 0 "^sagebwd +sagebwd +0\.99[89]" -- "$sagegen" reference-backward --n 512 --headdim 128 --k-bias 8 --preset sagebwd
expect "reference-backward --no-smooth-k: the ablation" 0 "^sagebwd +sagebwd +0\.8" -- "$sagegen" reference-backward --n 512 --headdim 128 --k-bias 8 --preset sagebwd --no-smooth-k
expect "reference-backward unknown preset" 1 "unknown backward preset 'sage-b'" -- "$sagegen" reference-backward --preset sage-b --n 16
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

# explain: every schedule's verdict in rank order, the choice and its plan (no GPU needed).
expect "explain lists the verdicts" 0 "1\. sm80\.mma_sync: supported" -- "$sagegen" explain --preset sage-b --headdim 64 --arch sm_80
expect "explain names the choice" 0 "chosen: sm90\.wgmma_tma \(default plan\)" -- "$sagegen" explain --preset sage-b --arch sm_90a
expect "explain plans SLA's sparse part, block-sparse on sm90" 0 "chosen: sm90\.wgmma_tma \(default plan\)" -- "$sagegen" explain --preset sla-f16 --arch sm_90a
expect "explain prints the block-sparse mask walk" 0 "mask +block-sparse: the CTA's block_mask row" -- "$sagegen" explain --preset sla-int8 --arch sm_90a
expect "explain falls back to sm80 where sm90 cannot run" 0 "chosen: sm80\.mma_sync \(default plan\)" -- "$sagegen" explain --preset sage-b --arch sm_89
expect "explain prints the tunables" 0 "tunables +block_q=128,block_kv=128,warps=8,stages=[0-9]+" -- "$sagegen" explain --preset sage-b --causal --arch sm_90a
expect "explain prints the warp roles" 0 "1 producer warpgroup, 2 consumer warpgroups" -- "$sagegen" explain --preset sage-b --arch sm_90a
expect "explain prints a persistent grid" 0 "persistent: 1 CTA\(s\) per SM" -- "$sagegen" explain --preset sage-b --arch sm_90a
expect "explain prints inline loads" 0 "no producer warpgroup: 1 consumer warpgroup" -- "$sagegen" explain --preset sage2-fp8 --arch sm_90a
expect "explain prints the Q.K^T mma" 0 "Q\.K\^T mma +m16n8k32 int8\.int8 -> s32" -- "$sagegen" explain --preset sage-b --headdim 64 --arch sm_80
expect "explain prints the P.V path" 0 "P\.V path +e4m3 P x e4m3 V\^T, f32 accumulator" -- "$sagegen" explain --preset sage2-fp8 --arch sm_89
expect "explain prints the V source" 0 "V source +workspace v_values" -- "$sagegen" explain --preset sage-b --arch sm_80 --input bf16
expect "explain runs INT4 on sm_90a as the legalized s4 -> s8 program" 0 "legalized for sm_90a: 2 sage.decode: .*to int8 \(emulation\)" -- "$sagegen" explain --preset sage2-int4 --arch sm_90a
expect "explain: INT4 with Q smoothing runs on the sm80 schedule" 0 "chosen: sm80\.mma_sync \(default plan\)" -- "$sagegen" explain --preset sage2-int4 --arch sm_90a
expect "explain: no sage.decode where the target multiplies int4" 0 "legalized for sm_89: no sage.decode" -- "$sagegen" explain --preset sage2-int4 --arch sm_89
expect "explain: the kernel still multiplies int4 as int8 on sm_89" 0 "int4 codes decoded to int8" -- "$sagegen" explain --preset sage2-int4 --arch sm_89
expect "explain: FP4 runs by emulation on sm_90a" 0 "FP4 by emulation: decode e2m1 x ue4m3 to f16 \(exact\), f16 mma\.sync, f32 accumulation" -- "$sagegen" explain --preset sage3-fp4 --headdim 128 --arch sm_90a
expect "explain: MXFP4 decodes to bf16" 0 "FP4 by emulation: decode e2m1 x ue8m0 to bf16 \(exact\), bf16 mma\.sync" -- "$sagegen" explain --preset sage3-mxfp4 --arch sm_80
expect "explain: the sm90 schedule leaves FP4 to the sm80 one" 0 "sm90\.wgmma_tma: unsupported: e2m1 \(FP4\) operands: only the sm80 kernel writer emulates FP4" -- "$sagegen" explain --preset sage3-fp4-direct-p --arch sm_90a
expect "explain prints the grid" 0 "grid += \(ceil\(tokens_q / 128\), heads_q, batch\).*longest rows first" -- "$sagegen" explain --preset sage-b --causal --lse --arch sm_86
expect "explain prints the shared memory" 0 "shared +[0-9]+ bytes \(Q [0-9]+, [0-9]+ stages of" -- "$sagegen" explain --preset exact --arch sm_86
expect "explain --backward picks the wgmma backward on sm_90a" 0 "chosen: sm90\.wgmma_backward" -- "$sagegen" explain --backward --preset sagebwd --arch sm_90a --input bf16
expect "explain --backward: per-key P/dS scales on the wgmma backward (issue 25)" 0 "plan +sm90\.wgmma_backward .* key-scales" -- "$sagegen" explain --backward --preset sagebwd-rot-ks --arch sm_90a
expect "explain --backward says why not on sm_89" 0 "1\. sm90\.wgmma_backward: unsupported: sm_89 has no wgmma" -- "$sagegen" explain --backward --preset sagebwd --arch sm_89
expect "explain --backward: nothing runs the int8 dO.V^T ablation" 1 "no backward schedule supports 'sagebwd-int8-dp' on sm_90a" -- "$sagegen" explain --backward --preset sagebwd-int8-dp --arch sm_90a
expect "explain --backward refuses --lse" 1 "--lse: backward presets read the forward's LSE" -- "$sagegen" explain --backward --preset sagebwd --lse --arch sm_90a
expect "explain chooses the FP4 schedule on sm_120f" 0 "chosen: sm120\.mma_fp4 \(default plan\)" -- "$sagegen" explain --preset sage3-fp4 --arch sm_120f
# Packed variable-length batches (issue 28): the IR's keyword, the schedules' verdicts.
expect "ir --packed puts the keyword on the header" 0 'block_kv\(64\) packed_sequences \{' -- "$sagegen" ir --preset sage-b --packed
"$sagegen" ir --preset sage2-fp8 --causal --packed >"$work/packed.mlir"
expect "check accepts a packed program" 0 "packed\.mlir: ok" -- "$sagegen" check "$work/packed.mlir"
expect "ir --packed refuses SLA" 1 "packed_sequences: SLA is not built for packed batches yet" -- "$sagegen" ir --preset sla-f16 --packed
expect "explain --packed: sm90 runs packed sage-b" 0 "chosen: sm90\.wgmma_tma \(default plan\)" -- "$sagegen" explain --preset sage-b --causal --packed --arch sm_90a
expect "explain --packed says so" 0 "packed sequences: each sequence's lengths" -- "$sagegen" explain --preset sage2-fp8 --packed --arch sm_89
expect "explain --ir of a packed program" 0 "packed sequences: each sequence's lengths" -- "$sagegen" explain --ir "$work/packed.mlir" --arch sm_90a
expect "explain --packed: no FP4 kernel for packed batches" 1 "sm120\.mma_fp4: unsupported: packed sequences: not built for the FP4 kernel yet" -- "$sagegen" explain --preset sage3-fp4 --packed --arch sm_120f
expect "explain --packed: FP4 emulation neither" 1 "sm80\.mma_sync: unsupported: packed sequences: not built for FP4" -- "$sagegen" explain --preset sage3-fp4 --packed --arch sm_90a
expect "explain --packed with an --ir file" 1 "--packed: they apply to --preset" -- "$sagegen" explain --ir "$work/packed.mlir" --packed --arch sm_90a
expect "explain --packed --backward" 1 "--packed: the backward is not built for packed sequences" -- "$sagegen" explain --backward --preset sagebwd --packed --arch sm_90a
expect "explain prints the FP4 plan" 0 "FP4 +ue4m3 scales per 16 elements; P two-level.*K rows read permuted in shared memory" -- "$sagegen" explain --preset sage3-fp4 --arch sm_120f
expect "explain says why not sm_100f" 0 "sm120\.mma_fp4: unsupported: sm_100f: ptxas 13\.0 rejects the block-scaled mma\.sync" -- "$sagegen" explain --preset sage3-mxfp4 --arch sm_100f
expect "sm_100f runs FP4 by emulation" 0 "chosen: sm80\.mma_sync" -- "$sagegen" explain --preset sage3-fp4 --arch sm_100f
expect "explain of an IR file" 0 "variant 'sage-vb' d128 none, with LSE, f16 inputs, on sm_89" -- "$sagegen" explain --ir "$work/good.mlir" --arch sm_89
expect "explain gives the reason" 1 "sm80\.mma_sync: unsupported: e4m3 P\.V needs mma\.sync m16n8k32 e4m3 \(sm_89 or newer\)" -- "$sagegen" explain --preset sage2-fp8 --arch sm_80
expect "explain says none is chosen" 1 "no schedule supports variant 'sage2-fp8' on sm_80" -- "$sagegen" explain --preset sage2-fp8 --arch sm_80
expect "explain needs --arch" 1 "--arch: name the target architecture" -- "$sagegen" explain --preset sage-b
expect "explain bad --arch" 1 "--arch: unknown architecture 'sm_70'" -- "$sagegen" explain --preset sage-b --arch sm_70
expect "explain bad --input" 1 "--input: expected f16 or bf16, got 'f8'" -- "$sagegen" explain --preset sage-b --arch sm_80 --input f8
expect "explain unknown preset" 1 "--preset: unknown preset 'sage-x'" -- "$sagegen" explain --preset sage-x --arch sm_80
expect "explain needs a preset or an IR file" 1 "--preset/--ir: name exactly one" -- "$sagegen" explain --arch sm_80
expect "explain takes one of --preset and --ir" 1 "--preset/--ir: name exactly one" -- "$sagegen" explain --preset sage-b --ir "$work/good.mlir" --arch sm_80
expect "explain --ir refuses preset options" 1 "--headdim/--causal/--lse/--packed: they apply to --preset" -- "$sagegen" explain --ir "$work/good.mlir" --causal --arch sm_80
expect "explain of a missing IR file" 1 "--ir: cannot open" -- "$sagegen" explain --ir "$work/missing.mlir" --arch sm_80

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

count() { find "$1" -maxdepth 1 -name "$2" | wc -l; }

# emit: kernels + manifest, content-named files, stale files of a previous emit removed.
expect "emit writes the kernels and a manifest" 0 "wrote 3 kernels of 1 variants \(9 files\)" -- \
  "$sagegen" emit --preset sage-b --headdim 64 --arch sm_89 --format all -o "$work/emit"
check "emit wrote 3 .cu, 3 .ptx, 3 .cubin (2 prologue launches, 1 attention kernel)" test "$(count "$work/emit" '*.cu') $(count "$work/emit" '*.ptx') $(count "$work/emit" '*.cubin')" = "3 3 3"
check "emit's manifest names the schema, keys and ptxas registers" \
  grep -q '"schema": "sagegen-aot-manifest"' "$work/emit/manifest.json"
check "emit's manifest has key digests" test "$(grep -c '"key_digest": "[0-9a-f]\{64\}"' "$work/emit/manifest.json")" = 3
check "emit's manifest has registers" test "$(grep -c '"registers": [1-9]' "$work/emit/manifest.json")" = 3
check "emit's attention source is named by entry point and content" \
  test "$(count "$work/emit" 'sage_attention_sage_b_d64_f16_sm_89-????????????.cu')" = 1
# emit --packed (issue 28): the packed variant's kernels, marked so in the manifest, none under a dense kernel's key.
expect "emit --packed writes the packed variant's kernels" 0 "wrote [1-9][0-9]* kernels of 1 variants" -- \
  "$sagegen" emit --packed --preset sage-b --headdim 64 --arch sm_89 -o "$work/emit-packed"
check "emit --packed marks every kernel packed" test "$(grep -c '"packed": true' "$work/emit-packed/manifest.json")" = \
  "$(grep -c '"key_digest"' "$work/emit-packed/manifest.json")"
check "a dense emit's manifest has no packed field" test "$(grep -c '"packed"' "$work/emit/manifest.json")" = 0
digests() { grep -o '"key_digest": "[0-9a-f]*"' "$1" | sort; }
check "emit --packed's keys are not the dense variant's" \
  test -z "$(comm -12 <(digests "$work/emit/manifest.json") <(digests "$work/emit-packed/manifest.json"))"
expect "emit --packed refuses SLA, naming --packed" 1 \
  "sagegen: --packed: --preset sla-f16 --arch sm_90a has no packed kernels: .*SLA is not built for packed" -- \
  "$sagegen" emit --packed --preset sla-f16 --arch sm_90a -o "$work/packed-sla"
check "emit --packed writes nothing when refused" test ! -e "$work/packed-sla"
expect "emit --packed with a schedule that cannot pack FP4" 1 \
  "sagegen: --packed: --preset sage3-fp4 --arch sm_90a has no packed kernels: .*packed sequences: not built for FP4" \
  -- "$sagegen" emit --packed --preset sage3-fp4 --arch sm_90a -o "$work/packed-fp4"
expect "emit --packed --backward" 1 "sagegen: --packed: backward presets are not built for packed sequences" -- \
  "$sagegen" emit --packed --backward --preset sagebwd --arch sm_80 -o "$work/packed-bwd"
expect "emit --defaults --packed" 1 "sagegen: --defaults: .*do not combine it with .*--packed" -- \
  "$sagegen" emit --defaults --packed -o "$work/x"
expect "emit again replaces the previous kernels" 0 "removed sage_attention_sage_b_d64_f16_sm_89-.*\.cubin" -- \
  "$sagegen" emit --preset sage-t --headdim 64 --causal --lse --input bf16 --arch sm_80 -o "$work/emit"
check "only the new kernels remain" test "$(count "$work/emit" '*.cubin') $(count "$work/emit" '*sage_b*')" = "0 0"
expect "emit --backward writes the SageBwd module" 0 "wrote 1 kernels of 1 variants \(2 files\)" -- \
  "$sagegen" emit --backward --preset sagebwd --headdim 64 --arch sm_80 --format cubin -o "$work/emit-bwd"
check "emit --backward's manifest lists it with role backward" grep -q '"role": "backward"' "$work/emit-bwd/manifest.json"
check "emit --backward's module is named by content" \
  test "$(count "$work/emit-bwd" 'sagebwd_d64_f16_sm_80_sm80_mma_sync_backward-????????????.sm_80.cubin')" = 1
warmed=$("$sagegen" cache warm --dir "$work/emit-bwd-cache" --backward --preset sagebwd --headdim 64 --arch sm_80 |
  sed -nE 's/^built +([0-9a-f]{12}) .*/\1/p')
check "emit --backward's key is the one cache warm --backward computes" \
  grep -qE "\"key_digest\": \"${warmed:-none}[0-9a-f]{52}\"" "$work/emit-bwd/manifest.json"
expect "emit of an SLA preset writes its sparse part and the SLA module" 0 "wrote 3 kernels of 1 variants \(6 files\)" -- \
  "$sagegen" emit --preset sla-f16 --headdim 64 --arch sm_80 --format cubin -o "$work/emit-sla"
check "emit's SLA manifest lists the module with role sla" grep -q '"role": "sla"' "$work/emit-sla/manifest.json"
expect "emit --backward of a forward preset" 1 "sagegen: --preset: unknown backward preset 'sage-b'" -- \
  "$sagegen" emit --backward --preset sage-b --arch sm_80 -o "$work/x"
expect "emit unsupported" 1 "sagegen: --preset sage2-fp8 --arch sm_80: not supported: .*sm_89 or newer" -- \
  "$sagegen" emit --preset sage2-fp8 --arch sm_80 -o "$work/fp8"
check "emit writes nothing when unsupported" test ! -e "$work/fp8"
expect "emit bad arch" 1 "sagegen: --arch: unknown architecture 'sm_70'" -- "$sagegen" emit --preset sage-b --arch sm_70 -o "$work/x"
expect "emit bad format" 1 "sagegen: --format: expected cu, ptx, cubin or all, got 'elf'" -- \
  "$sagegen" emit --preset sage-b --arch sm_80 --format elf -o "$work/x"
expect "emit bad input" 1 "sagegen: --input: expected f16 or bf16, got 'f32'" -- \
  "$sagegen" emit --preset sage-b --arch sm_80 --input f32 -o "$work/x"
expect "emit unknown preset" 1 "sagegen: --preset: unknown preset 'sage-q'" -- "$sagegen" emit --preset sage-q --arch sm_80 -o "$work/x"
expect "emit without --arch" 1 "sagegen: --arch: required" -- "$sagegen" emit --preset sage-b -o "$work/x"
expect "emit without --preset" 1 "sagegen: --preset: required \(or --defaults" -- "$sagegen" emit --arch sm_80 -o "$work/x"
expect "emit without -o" 1 "output is required" -- "$sagegen" emit --preset sage-b --arch sm_80
expect "emit --defaults with --preset" 1 "sagegen: --defaults: .*do not combine it with --preset, --arch, --backward, --packed or --tunables" -- \
  "$sagegen" emit --defaults --preset sage-b -o "$work/x"
touch "$work/file"
expect "emit into a file" 1 "sagegen: -o: cannot create the directory .*/file" -- \
  "$sagegen" emit --preset sage-b --arch sm_80 -o "$work/file"

# cache: warm fills it with NVRTC only, ls lists, verify finds damage, --fix removes it, clear empties.
cache=$work/cache
expect "cache warm builds every kernel" 0 "^built +[0-9a-f]{12}  sage_attention_sage_t_d64_f16_sm_80" -- \
  env SAGEGEN_CACHE_DIR="$cache" "$sagegen" cache warm --preset sage-t --headdim 64 --arch sm_80
expect "cache warm again finds them on disk" 0 "^disk +[0-9a-f]{12}  sage_prologue" -- \
  "$sagegen" cache warm --dir "$cache" --preset sage-t --headdim 64 --arch sm_80
entries=$(count "$cache" '*.kernel')
check "cache warm wrote several entries" test "$entries" -ge 2
# --tunables: the kernels of those tunables (a different key), fields left out keep the defaults; refused with a reason
# where the schedule cannot take them, and for backward presets (whose schedule plans alone).
tuned=$work/tuned-cache
expect "cache warm --tunables builds that plan's kernel" 0 "^built +[0-9a-f]{12}  sage_attention_sage_b_d64_f16_sm_90a" -- \
  "$sagegen" cache warm --dir "$tuned" --preset sage-b --headdim 64 --arch sm_90a --tunables block_q=64,block_kv=64,warps=4,stages=2
expect "the default plan is another kernel" 0 "^built +[0-9a-f]{12}  sage_attention_sage_b_d64_f16_sm_90a" -- \
  "$sagegen" cache warm --dir "$tuned" --preset sage-b --headdim 64 --arch sm_90a
expect "cache warm --tunables names the tunable the schedule refuses" 1 "tunables\.block_kv: expected 64 or 128" -- \
  "$sagegen" cache warm --dir "$tuned" --preset sage-b --arch sm_90a --tunables block_kv=96
expect "cache warm --tunables --backward is refused" 1 "--tunables: backward presets take their schedule's plan" -- \
  "$sagegen" cache warm --dir "$tuned" --backward --preset sagebwd --arch sm_90a --tunables warps=4

expect "cache ls lists the entries" 0 "^$entries entries \($entries valid, 0 damaged\)" -- \
  env SAGEGEN_CACHE_DIR="$cache" "$sagegen" cache ls
expect "cache ls shows each key" 0 "^[0-9a-f]{12} +[0-9.]+ KiB  sm80.mma_sync +sm_80 +64  sage_attention_sage_t_d64_f16_sm_80 +ok" -- \
  "$sagegen" cache ls --dir "$cache"
victim=$(find "$cache" -name '*.kernel' | sort | head -n 1)
printf '\x55' | dd of="$victim" bs=1 seek=300 conv=notrunc status=none
truncated=$(find "$cache" -name '*.kernel' | sort | sed -n 2p)
truncate -s 40 "$truncated"
expect "cache verify reports damage and fails" 1 "damaged .*: checksum mismatch" -- "$sagegen" cache verify --dir "$cache"
expect "cache verify reports truncation" 1 "damaged .*: truncated" -- "$sagegen" cache verify --dir "$cache"
expect "cache verify says how to fix" 1 "sagegen: cache verify: 2 damaged entries \(remove them with" -- \
  "$sagegen" cache verify --dir "$cache"
expect "cache ls marks damaged entries" 0 "damaged: checksum mismatch" -- "$sagegen" cache ls --dir "$cache"
expect "cache verify --fix removes them" 0 "checked $entries entries: 2 damaged" -- "$sagegen" cache verify --dir "$cache" --fix
check "the damaged files are gone" test ! -e "$victim" -a ! -e "$truncated"
expect "cache verify is clean afterwards" 0 "checked $((entries - 2)) entries: 0 damaged" -- "$sagegen" cache verify --dir "$cache"
expect "cache clear" 0 "removed $((entries - 2)) entries from $cache" -- "$sagegen" cache clear --dir "$cache"
expect "cache ls after clear" 0 "^0 entries" -- "$sagegen" cache ls --dir "$cache"
expect "cache ls of a missing --dir" 1 "sagegen: --dir: '$work/nowhere' is not a directory" -- "$sagegen" cache ls --dir "$work/nowhere"
expect "cache clear of a missing --dir" 1 "sagegen: --dir: '$work/nowhere' is not a directory" -- "$sagegen" cache clear --dir "$work/nowhere"
expect "cache warm into a file" 1 "sagegen: --dir: cannot use it as a kernel cache" -- \
  "$sagegen" cache warm --dir "$work/file/sub" --preset sage-t --arch sm_80
expect "cache warm bad arch" 1 "sagegen: --arch: unknown architecture 'sm_1'" -- "$sagegen" cache warm --dir "$cache" --preset sage-t --arch sm_1
expect "cache warm without --preset" 1 "preset is required" -- "$sagegen" cache warm --dir "$cache" --arch sm_80
# cache warm for the SageBwd backward module and an SLA preset (its sparse part's kernels and the SLA module).
aux=$work/aux-cache
expect "cache warm --backward builds the backward module" 0 "^built +[0-9a-f]{12}  sagebwd_d64_f16_sm_80_sm80_mma_sync_backward" -- \
  "$sagegen" cache warm --dir "$aux" --backward --preset sagebwd --headdim 64 --arch sm_80
expect "cache warm --backward again finds it on disk" 0 "^disk +[0-9a-f]{12}  sagebwd_d64_f16_sm_80" -- \
  "$sagegen" cache warm --dir "$aux" --backward --preset sagebwd --headdim 64 --arch sm_80
expect "cache warm of an SLA preset builds the SLA module" 0 "^built +[0-9a-f]{12}  sage_sla_d64_bq64_bkv64_softmax" -- \
  "$sagegen" cache warm --dir "$aux" --preset sla-f16 --headdim 64 --arch sm_80
expect "cache warm of an SLA preset builds its sparse part" 0 "^built +[0-9a-f]{12}  sage_attention_sla_f16_elu_d64_block_sparse" -- \
  "$sagegen" cache warm --dir "$aux" --preset sla-f16-elu --headdim 64 --arch sm_80
expect "cache ls shows the backward module" 0 "^[0-9a-f]{12} +[0-9.]+ KiB  sm80.mma_sync_backward +sm_80 +64  sagebwd_d64_f16_sm_80_sm80_mma_sync_backward +ok" -- \
  "$sagegen" cache ls --dir "$aux"
expect "cache ls shows the SLA module" 0 "^[0-9a-f]{12} +[0-9.]+ KiB  sla +sm_80 +64  sage_sla_d64_bq64_bkv64_softmax +ok" -- \
  "$sagegen" cache ls --dir "$aux"
expect "cache verify checks them" 0 "^checked $(count "$aux" '*.kernel') entries: 0 damaged" -- "$sagegen" cache verify --dir "$aux"
expect "cache warm --backward of a forward preset" 1 "sagegen: --preset: unknown backward preset 'sage-b'; expected one of sagebwd" -- \
  "$sagegen" cache warm --dir "$aux" --backward --preset sage-b --arch sm_80
expect "cache warm --backward --lse" 1 "sagegen: --lse: backward presets" -- \
  "$sagegen" cache warm --dir "$aux" --backward --preset sagebwd --arch sm_80 --lse
expect "cache warm of an SLA preset in bf16 builds the bf16 SLA module" 0 "^built +[0-9a-f]{12}  sage_sla_d64_bq64_bkv64_softmax_bf16" -- \
  "$sagegen" cache warm --dir "$aux" --preset sla-f16 --headdim 64 --arch sm_80 --input bf16
expect "cache without a subcommand" 1 "" -- "$sagegen" cache
expect "cache unknown subcommand" 1 "" -- "$sagegen" cache frob

summary
