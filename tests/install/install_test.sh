#!/usr/bin/env bash
# cmake --install into a fresh prefix: the installed files and headers, the C++ libraries' exported symbols, then a C
# consumer project outside the tree builds against it with find_package(sagegen) and runs; the installed Python
# package finds the installed library by itself. (tools/install-check builds and runs the C++ example the same way.)
set -euo pipefail
build=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
prefix=$work/prefix
for file in include/sage/sage_c.h lib/libsagegen_c.so bin/sagegen lib/cmake/sagegen/sagegenConfig.cmake \
  lib/cmake/sagegen/sagegenConfigVersion.cmake lib/python3/site-packages/sagegen/__init__.py \
  include/sage/sage.h include/sage/dsl/Attention.h include/sage/runtime/AttentionRunner.h lib/libsagegen_dsl.so \
  lib/libsagegen_runtime.so; do
  [[ -e $prefix/$file ]] || { echo "FAILED: $file is not installed"; exit 1; }
done
# The C++ packages install public headers and what they include, not the MLIR dialect's or the C ABI's internals.
for file in include/sage/ir/Dialect.h include/sage/ir/OpTraits.h include/sage/runtime/CApiArguments.h; do
  [[ ! -e $prefix/$file ]] || { echo "FAILED: $file is installed"; exit 1; }
done
if grep -rqE '#[ \t]*include[ \t]*[<"](mlir|llvm|fmt|cuda)' "$prefix/include"; then
  grep -rE '#[ \t]*include[ \t]*[<"](mlir|llvm|fmt|cuda)' "$prefix/include"
  echo "FAILED: an installed header includes a dependency's header"
  exit 1
fi
# They export the project's symbols only: the static MLIR inside libsagegen_dsl.so stays private.
for library in libsagegen_dsl.so libsagegen_runtime.so; do
  nm -DC --defined-only "$prefix/lib/$library" | cut -d' ' -f3- >"$work/exports.txt"
  [[ -s $work/exports.txt ]] || { echo "FAILED: $library exports nothing"; exit 1; }
  if grep -vE '^((typeinfo( name)?|vtable|VTT|guard variable) for )?sage::' "$work/exports.txt" >"$work/foreign.txt"; then
    head "$work/foreign.txt"
    echo "FAILED: $library exports symbols outside namespace sage"
    exit 1
  fi
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
