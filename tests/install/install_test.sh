#!/usr/bin/env bash
# cmake --install into a fresh prefix, then a consumer project outside the tree builds against it with
# find_package(sagegen) and runs; the installed Python package finds the installed library by itself.
set -euo pipefail
build=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
for file in include/sage/sage_c.h lib/libsagegen_c.so bin/sagegen lib/cmake/sagegen/sagegenConfig.cmake \
  lib/python3/site-packages/sagegen/__init__.py; do
  [[ -e $work/prefix/$file ]] || { echo "FAILED: $file is not installed"; exit 1; }
done
cmake -S "$source_dir/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
"$work/prefix/bin/sagegen" list >/dev/null
if command -v python3 >/dev/null; then
  env -u SAGEGEN_LIBRARY PYTHONPATH="$work/prefix/lib/python3/site-packages" python3 -c \
    "import sagegen, sagegen._library as l; print('python:', sagegen.version(), l.find_library())" |
    tee "$work/python.log"
  grep -q "$work/prefix/lib/libsagegen_c.so" "$work/python.log" || { echo "FAILED: python found another library"; exit 1; }
fi
echo "install test: OK"
