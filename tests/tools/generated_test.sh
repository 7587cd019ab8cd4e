#!/usr/bin/env bash
# generated/ is exactly what `sagegen emit --defaults` writes today: regenerates into a temporary directory and
# fails on any difference, naming the files and the command that updates generated/. When this NVRTC is not the
# one that made generated/, ptxas's numbers and the compiler version (in the keys, hence their digests) may
# differ: those are left out of the comparison, and the output says so.
set -u
sagegen=$1
committed=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
regenerate="build/tools/sagegen/sagegen emit --defaults -o generated/"

if ! "$sagegen" emit --defaults -o "$work/generated" >"$work/emit.log" 2>&1; then
  cat "$work/emit.log"
  echo "FAILED: sagegen emit --defaults failed"
  exit 1
fi

nvrtc_of() { sed -n 's/^  "nvrtc_version": "\(.*\)",$/\1/p' "$1/manifest.json"; }
recorded=$(nvrtc_of "$committed")
current=$(nvrtc_of "$work/generated")
if [[ -z $recorded ]]; then
  echo "FAILED: $committed/manifest.json is missing or has no nvrtc_version; regenerate with: $regenerate"
  exit 1
fi
cp -r "$committed" "$work/committed"
rm -f "$work/committed/README.md"
if [[ $recorded != "$current" ]]; then
  echo "NOTE: generated/ was made with NVRTC $recorded, this is NVRTC $current: comparing everything except"
  echo "      ptxas's numbers (registers, spills, shared memory, stack) and the compiler version in the keys."
  for manifest in "$work/committed/manifest.json" "$work/generated/manifest.json"; do
    sed -E -i \
      -e 's/"(registers|spill_store_bytes|spill_load_bytes|static_shared_bytes|stack_frame_bytes)": [0-9]+/"\1": N/' \
      -e 's/"nvrtc_version": "[^"]*"/"nvrtc_version": "V"/' \
      -e 's/\\ncompiler_version=[^\\]*\\n/\\ncompiler_version=V\\n/' \
      -e 's/"key_digest": "[0-9a-f]{64}"/"key_digest": "D"/' \
      "$manifest"
  done
fi

if ! diff -r -q "$work/committed" "$work/generated" >"$work/differences" 2>&1; then
  sed -e "s|$work/committed|generated|g" -e "s|$work/generated|regenerated|g" "$work/differences"
  if ! cmp -s "$work/committed/manifest.json" "$work/generated/manifest.json"; then
    echo "--- first lines of the manifest diff (generated/ vs regenerated):"
    diff "$work/committed/manifest.json" "$work/generated/manifest.json" | head -n 20
  fi
  echo "FAILED: generated/ is out of date; regenerate it from the repository root with:"
  echo "  $regenerate"
  exit 1
fi
echo "generated/ matches sagegen emit --defaults ($(grep -c '"key_digest"' "$committed/manifest.json") kernels, NVRTC $current)"
