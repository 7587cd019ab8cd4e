#!/usr/bin/env bash
# Hostile inputs to the sagegen command line (issue 10): each one crashed, hung, allocated gigabytes or was
# silently accepted before. Each must now end quickly with exit 1 and a message naming the argument, field or
# position and what was expected. Every command runs under a timeout, so a hang fails the test instead of CI.
set -u
sagegen=$1
expect_timeout=60
source "$(dirname "$0")/expect.sh"

# --- reference: sizes and values from the command line
expect "reference --n past the limit" 1 "--n: .*144115188075855872" -- "$sagegen" reference --n 144115188075855872 --heads 1
expect "reference size product past the memory limit" 1 "the CPU reference would need .* GiB" -- \
  "$sagegen" reference --n 16777216 --batch 65535 --heads 4096 --kv-heads 1
expect "reference work past the limit" 1 "multiply-adds .* the limit is 2\^38" -- "$sagegen" reference --n 1000000 --heads 1
expect "reference --kv-heads 0" 1 "--kv-heads: .*0" -- "$sagegen" reference --kv-heads 0 --n 64
expect "reference --n-kv -7" 1 "--n-kv: .*-7" -- "$sagegen" reference --n-kv -7 --n 64
expect "reference --k-bias nan" 1 "--k-bias: expected a finite number in \[0, 10000\], got 'nan'" -- "$sagegen" reference --k-bias nan --n 64
expect "reference --k-bias inf" 1 "--k-bias: expected a finite number" -- "$sagegen" reference --k-bias inf --n 64
expect "reference --batch 0" 1 "--batch: .*0" -- "$sagegen" reference --batch 0 --n 64

expect "tune --budget nan" 1 "--budget: expected a finite, non-negative number" -- "$sagegen" tune --preset sage-b --n 1024 --budget nan
expect "tune --n 2^40" 1 "--n: expected positive sequence lengths, got 1099511627776 \(the limit is 2\^24\)" -- \
  "$sagegen" tune --preset sage-b --n 1099511627776
expect "tune --batch-heads overflow" 1 "--batch-heads: expected BATCHxHEADS with BATCH in \[1, 65535\]" -- \
  "$sagegen" tune --preset sage-b --n 1024 --batch-heads 9223372036854775807x2

# --- IR files: not regular files, oversized, nested, cyclic, out-of-range attributes
"$sagegen" ir --preset sage-b --headdim 64 >"$work/good.mlir"
mkfifo "$work/fifo.mlir"
expect "check of a FIFO does not block" 1 "FILE: '.*fifo\.mlir': expected a regular file" -- "$sagegen" check "$work/fifo.mlir"
expect "check of /dev/zero does not eat memory" 1 "FILE: '/dev/zero': expected a regular file" -- "$sagegen" check /dev/zero
expect "check of a directory" 1 "FILE: '.*': expected a regular file" -- "$sagegen" check "$work"
truncate -s 16G "$work/sparse.mlir"
expect "check of a sparse 16 GiB file" 1 "expected at most 1048576 bytes" -- "$sagegen" check "$work/sparse.mlir"
rm "$work/sparse.mlir"
{ printf 'sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) attributes {x = '; head -c 6000 /dev/zero | tr '\0' '['; } >"$work/nested.mlir"
expect "check of thousands of nested [" 1 "nested\.mlir:1:[0-9]+: error: brackets nest deeper than 32" -- "$sagegen" check "$work/nested.mlir"
sed 's/%q_int8 = sage.quantize %q to/%q_int8 = sage.quantize %q_int8 to/' "$work/good.mlir" >"$work/self.mlir"
expect "check of a value used in its own definition" 1 "self\.mlir:[0-9]+:[0-9]+: error: .*operand #0 is used before \(or in\) its definition" -- \
  "$sagegen" check "$work/self.mlir"
printf 'sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) {\n  %%a = sage.dequant %%b\n}\n' >"$work/undefined.mlir"
expect "check of a use without a definition" 1 "undefined\.mlir:2:[0-9]+: error" -- "$sagegen" check "$work/undefined.mlir"
sed 's/block_kv(64)/block_kv(4294967296)/' "$work/good.mlir" >"$work/huge_block.mlir"
expect "check of block_kv(2^32)" 1 "block_kv must be a positive multiple of 16 up to 1024, got 4294967296" -- "$sagegen" check "$work/huge_block.mlir"
expect "reference --ir of block_kv(2^32) ends" 1 "block_kv must be a positive multiple of 16 up to 1024" -- \
  "$sagegen" reference --ir "$work/huge_block.mlir" --n 64
sed 's/block_kv(64)/block_kv(-64)/' "$work/good.mlir" >"$work/negative_block.mlir"
expect "check of block_kv(-64)" 1 "block_kv must be a positive multiple of 16 up to 1024, got -64" -- "$sagegen" check "$work/negative_block.mlir"
sed 's/{group_tokens = 64 : i64}/{group_tokns = 64 : i64}/' "$work/good.mlir" >"$work/misspelled.mlir"
expect "check of a misspelled attribute" 1 "unknown attribute 'group_tokns'; expected .*group_tokens" -- "$sagegen" check "$work/misspelled.mlir"

# --- .npy samples (select): overflowing shapes, huge headers, decoys
mkdir -p "$work/npy"
python3 - "$work/npy" <<'PY'
import struct, sys
d = sys.argv[1]
def save(name, header, data=b"", version=1):
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    with open(f"{d}/{name}", "wb") as f:
        f.write(b"\x93NUMPY" + bytes([version, 0]) + size + header.encode() + data)
good = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 16, 16), }"
for role in "qkv":
    save(f"ok.{role}.npy", good, b"\0" * (16 * 16 * 4))
save("overflow.q.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }")
save("spaces.q.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + " " * 26000 + "1, 16, 16), }",
     b"\0" * 1024, version=2)
save("decoy.q.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 16, 16), 'x': \"'fortran_order': False\"}",
     b"\0" * 1024)
save("fortran.q.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 16, 16), }", b"\0" * 1024)
save("short.q.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 1024, 1024), }", b"\0" * 128)
with open(f"{d}/bighead.q.npy", "wb") as f:
    f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{")
PY
layer() { # layer NAME: a JSON list with NAME.q.npy and the good K, V
  printf '[{"layer": "x", "q": "%s.q.npy", "k": "ok.k.npy", "v": "ok.v.npy"}]' "$1" >"$work/npy/$1.json"
  echo "$work/npy/$1.json"
}
expect "npy shape past 2^63" 1 "overflow\.q\.npy.*more than 2\^63 bytes" -- "$sagegen" select "$(layer overflow)" -o "$work/x.json"
expect "npy with 26k spaces in its shape is read (no regex to overflow)" 0 "^x +16 +1 +16 " -- "$sagegen" select "$(layer spaces)" -o "$work/x.json"
expect "npy with a decoy fortran_order" 1 "decoy\.q\.npy.*unknown key 'x'" -- "$sagegen" select "$(layer decoy)" -o "$work/x.json"
expect "npy in Fortran order" 1 "fortran\.q\.npy.*'fortran_order': expected C order" -- "$sagegen" select "$(layer fortran)" -o "$work/x.json"
expect "npy claiming 4 GiB of data in 128 bytes" 1 "short\.q\.npy.*truncated data: the shape needs 4294967296 bytes" -- \
  "$sagegen" select "$(layer short)" -o "$work/x.json"
expect "npy claiming a 4 GiB header" 1 "bighead\.q\.npy.*header length 4294967280 exceeds the limit" -- \
  "$sagegen" select "$(layer bighead)" -o "$work/x.json"
mkfifo "$work/npy/fifo.q.npy"
expect "npy FIFO does not block" 1 "fifo\.q\.npy.*expected a regular file" -- "$sagegen" select "$(layer fifo)" -o "$work/x.json"

# --- issue 26: explain's IR file as check's, select's outputs, samples and budget
expect "explain --ir of a FIFO does not block" 1 "--ir: '.*fifo\.mlir': expected a regular file" -- \
  "$sagegen" explain --arch sm_80 --ir "$work/fifo.mlir"
expect "explain --ir of /dev/zero does not eat memory" 1 "--ir: '/dev/zero': expected a regular file" -- \
  "$sagegen" explain --arch sm_80 --ir /dev/zero
truncate -s 16G "$work/sparse.mlir"
expect "explain --ir of a sparse 16 GiB file" 1 "expected at most 1048576 bytes" -- "$sagegen" explain --arch sm_80 --ir "$work/sparse.mlir"
rm "$work/sparse.mlir"
python3 - "$work/npy" <<'PY'
import struct, sys
d = sys.argv[1]
def save(name, shape, data, descr="<f4"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, ", ".join(map(str, shape)))
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(f"{d}/{name}", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
values = [((i * 37) % 101 - 50) / 25.0 for i in range(16 * 16)]
save("nan.q.npy", (1, 16, 16), struct.pack("<256f", *(values[:100] + [float("nan")] + values[101:])))
save("huge.v.npy", (1, 16, 16), struct.pack("<256f", *([3e38] * 256)))
save("big.npy", (2, 16384, 64), b"\0" * (2 * 16384 * 64 * 2), "<f2")  # 4 MiB
PY
samples() { # samples NAME Q K V: a one-layer JSON list
  printf '[{"layer": "x", "q": "%s", "k": "%s", "v": "%s"}]' "$2" "$3" "$4" >"$work/npy/$1.json"
  echo "$work/npy/$1.json"
}
expect "select: a NaN sample names the file" 1 "SAMPLES: .*nan\.q\.npy: expected finite values, got nan at element 100" -- \
  "$sagegen" select "$(samples nan nan.q.npy ok.k.npy ok.v.npy)" -o "$work/x.json"
expect "select: values that overflow a candidate name the layer's files" 1 "SAMPLES: layer 'x' \(.*huge\.v\.npy\): preset .* is not finite" -- \
  "$sagegen" select "$(samples huge ok.q.npy ok.k.npy huge.v.npy)" -o "$work/x.json"
start=$(date +%s)
expect "select: the reference's compute limit, before any work" 1 "layer 'x' .*big\.npy.* multiply-adds .* the limit is 2\^38" -- \
  "$sagegen" select "$(samples big big.npy big.npy big.npy)" -o "$work/x.json"
check "select refuses past the limit at once" test $(($(date +%s) - start)) -lt 10
printf '[{"layer": "x", "q": "ok.q.npy\\u0000.txt", "k": "ok.k.npy", "v": "ok.v.npy"}]' >"$work/npy/nul.json"
expect "select: a NUL in a JSON path is refused, not cut short" 1 "nul\.json: \[0\]\.q: expected a path without NUL characters" -- \
  "$sagegen" select "$work/npy/nul.json" -o "$work/x.json"
printf '[{"layer": "x", "q": "ok.q.npy", "k": "ok.k.npy", "v": "ok.v.npy"}, {"layer": "x", "q": "ok.q.npy", "k": "ok.k.npy", "v": "ok.v.npy"}]' >"$work/npy/dup.json"
expect "select: a repeated layer name is refused" 1 "dup\.json: \[1\]\.layer: \"x\" is already the layer of \[0\]" -- \
  "$sagegen" select "$work/npy/dup.json" -o "$work/x.json"
expect "select -o refuses a character device" 1 "--output: /dev/null: expected a regular file or a new path, found a character device" -- \
  "$sagegen" select "$(layer ok)" -o /dev/null
check "/dev/null is still a character device" test -c /dev/null
mkfifo "$work/out.fifo"
expect "select -o refuses a FIFO" 1 "--output: .*out\.fifo: expected a regular file or a new path, found a FIFO" -- \
  "$sagegen" select "$(layer ok)" -o "$work/out.fifo"
check "the FIFO is still there" test -p "$work/out.fifo"
expect "select -o writes a new file" 0 "wrote 1 layer choice" -- "$sagegen" select "$(layer ok)" -o "$work/choices.json"
expect "select -o replaces a regular file" 0 "wrote 1 layer choice" -- "$sagegen" select "$(layer ok)" -o "$work/choices.json"

# --- tuning database: linear load, fields checked against the vocabulary
python3 - "$work/big.json" <<'PY'
import json, sys
entries = [{"variant": "sage-b", "head_dim": 128, "causal": False, "input": "f16", "tokens": n + 1,
            "tunables": "block_q=128,block_kv=64,warps=8,stages=3", "milliseconds": 1.0, "default_milliseconds": 1.0,
            "date": "2026-11-23T11:00:00Z"} for n in range(80000)]
json.dump({"format": "sagegen-tuning-db", "version": 1, "devices": [
    {"gpu": "G", "arch": "sm_90a", "sagegen_version": "0.1.0", "entries": entries}]}, open(sys.argv[1], "w"))
PY
start=$(date +%s)
expect "an 80k-entry tuning database loads" 0 "^800[0-9][0-9]$" -- bash -c "\"$sagegen\" tune --show --db \"$work/big.json\" | wc -l"
check "an 80k-entry tuning database loads in under 15 s" test $(($(date +%s) - start)) -lt 15
db() { # db FIELD VALUE: a one-entry database with FIELD set to VALUE
  python3 - "$work/db.json" "$1" "$2" <<'PY'
import json, sys
entry = {"variant": "sage-b", "head_dim": 128, "causal": False, "input": "f16", "tokens": 1024,
         "tunables": "block_q=128,block_kv=64,warps=8,stages=3", "milliseconds": 1.0, "default_milliseconds": 1.0,
         "date": "2026-11-23T11:00:00Z"}
entry[sys.argv[2]] = json.loads(sys.argv[3])
json.dump({"format": "sagegen-tuning-db", "version": 1, "devices": [
    {"gpu": "G", "arch": "sm_90a", "sagegen_version": "0.1.0", "entries": [entry, entry] if sys.argv[2] == "dup" else [entry]}]},
    open(sys.argv[1], "w"))
PY
  echo "$work/db.json"
}
expect "tuning db head_dim 100" 1 "entries\[0\]\.head_dim: expected a multiple of 16 in \[16, 256\], got 100" -- "$sagegen" tune --show --db "$(db head_dim 100)"
expect "tuning db head_dim 2^32+128" 1 "entries\[0\]\.head_dim: expected a multiple of 16" -- "$sagegen" tune --show --db "$(db head_dim 4294967424)"
expect "tuning db tokens -1" 1 "entries\[0\]\.tokens: expected an integer in \[1, 2\^40\]" -- "$sagegen" tune --show --db "$(db tokens -1)"
expect "tuning db repeated tunable" 1 "entries\[0\]\.tunables: expected .*each once" -- "$sagegen" tune --show --db "$(db tunables '"warps=4,warps=8"')"
expect "tuning db unknown tunable" 1 "entries\[0\]\.tunables" -- "$sagegen" tune --show --db "$(db tunables '"block_q=64,block_kv=64,warps=4,stages=2,turbo=1"')"
expect "tuning db odd variant name" 1 "entries\[0\]\.variant: expected a preset name" -- "$sagegen" tune --show --db "$(db variant '"../../etc"')"
expect "tuning db duplicate key" 1 "entries\[1\]: the same variant, head_dim, causal, input and tokens as .*entries\[0\]" -- \
  "$sagegen" tune --show --db "$(db dup 0)"
mkfifo "$work/fifo.json"
expect "tuning db FIFO does not block" 1 "fifo\.json: expected a regular file" -- "$sagegen" tune --show --db "$work/fifo.json"

# --- kernel cache: only sagegen's own files are deleted, and a fix that fails is an error
cache=$work/cache
mkdir -p "$cache"
hex=$(printf 'a%.0s' $(seq 64))
echo "my notes" >"$cache/notes.kernel"
echo "not an entry" >"$cache/$hex.kernel"
expect "cache clear keeps files it did not write" 0 "removed 0 entries" -- "$sagegen" cache clear --dir "$cache"
check "notes.kernel survives cache clear" test -e "$cache/notes.kernel" -a -e "$cache/$hex.kernel"
expect "cache verify --fix that cannot fix fails" 1 "cache verify --fix: 1 damaged entry could not be removed" -- \
  "$sagegen" cache verify --dir "$cache" --fix
check "verify --fix keeps a file without the entry header" test -e "$cache/$hex.kernel"
rm "$cache/$hex.kernel"
mkfifo "$cache/$hex.kernel"
expect "cache ls with a FIFO entry does not block" 0 "^0 entries" -- "$sagegen" cache ls --dir "$cache"

# --- emit: no symlink followed, no foreign file deleted, one emit per directory at a time
out=$work/emit
mkdir -p "$out"
echo "precious" >"$work/precious"
ln -s "$work/precious" "$out/manifest.json.tmp"
expect "emit writes its kernels" 0 "wrote 3 kernels" -- "$sagegen" emit --preset sage-b --headdim 64 --arch sm_80 --format cu -o "$out"
check "emit did not write through a planted symlink" test "$(cat "$work/precious")" = precious
cu=$(cd "$out" && ls sage_attention_sage_b_*.cu | head -n 1)
echo "edited by hand" >>"$out/$cu"
expect "emit of another variant keeps a file changed since" 0 "no longer the file emit wrote: kept" -- \
  "$sagegen" emit --preset sage-t --headdim 64 --arch sm_80 --format cu -o "$out"
check "the changed file is still there" test -e "$out/$cu"
# A previous manifest that names a file emit did not write (here with that file's hash) is refused: the file stays.
echo "my notes" >"$out/notes.txt"
python3 - "$out" <<'PY'
import hashlib, json, sys
path = sys.argv[1] + "/manifest.json"
manifest = json.load(open(path))
manifest["kernels"][0]["source"] = "notes.txt"
manifest["kernels"][0]["source_sha256"] = hashlib.sha256(open(sys.argv[1] + "/notes.txt", "rb").read()).hexdigest()
json.dump(manifest, open(path, "w"))
PY
expect "emit refuses a previous manifest naming a foreign file" 0 "kernels\[0\]\.source: expected \".*\.cu\" .*found \"notes\.txt\"" -- \
  "$sagegen" emit --preset sage-b --headdim 64 --arch sm_80 --format cu -o "$out"
check "the file that manifest listed is still there" test -e "$out/notes.txt"
# A FIFO under a kernel file's name: refused before anything is written.
cu=$(cd "$out" && ls sage_attention_sage_b_*.cu | head -n 1)
rm "$out/$cu" && mkfifo "$out/$cu"
before=$(cd "$out" && ls -l --time-style=+%s%N | md5sum)
expect "emit refuses to replace a FIFO" 1 "-o: .*$cu: expected a regular file or a new path, found a FIFO" -- \
  "$sagegen" emit --preset sage-b --headdim 64 --arch sm_80 --format cu -o "$out"
check "the refused emit changed nothing" test "$(cd "$out" && ls -l --time-style=+%s%N | md5sum)" = "$before"
rm "$out/$cu"
if command -v flock >/dev/null; then
  expect "a second emit into a locked directory fails" 1 "-o: another sagegen emit is writing" -- \
    flock "$out" "$sagegen" emit --preset sage-b --headdim 64 --arch sm_80 --format cu -o "$out"
fi

summary
