#!/usr/bin/env bash
# Installs ROCm's LLVM 23 (the third kernel compiler, docs/KERNELS.md) into build/llvm23/:
#   lib/libLLVM.so                  from the PyPI wheel rocm-bindings-compiler (pinned, hash checked)
#   lib/librocm_sysdeps_z.so.1      shims the library needs: forward to the system libz/libzstd
#   lib/librocm_sysdeps_zstd.so.1   with symbols versioned AMDROCM_SYSDEPS_1.0 (scripts/llvm23/)
# and checks that scripts/llvm23/clang-llvm23 can load it. Idempotent: a second run only checks.
# Needs python3 with pip, a C compiler (cc) and, to compile kernels, clang-22 and ld.lld-22.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=rocm-bindings-compiler
VERSION=10.0.0.0.1.2
WHEEL=rocm_bindings_compiler-$VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=f5cdc392fd65602a94ed2ae896280f39068769a47b122a5de00e5900a096a7a8
DIR=build/llvm23
say() { printf 'llvm23-setup: %s\n' "$*"; }

[[ $(uname -m) == x86_64 ]] || { echo "llvm23-setup: the $PACKAGE wheel is x86_64 only" >&2; exit 1; }
stamp="$DIR/.installed"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$PACKAGE==$VERSION $SHA256" ]]; then
  rm -rf "$DIR" && mkdir -p "$DIR/wheel" "$DIR/lib"
  python=python3; [[ -x build/venv/bin/python3 ]] && python=build/venv/bin/python3
  say "pip download $PACKAGE==$VERSION (~49 MB)"
  # The wheel's Python extension modules are not used (only its libLLVM.so, through ctypes),
  # so the download names the wheel's own platform and Python instead of the host's.
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
    -d "$DIR/wheel" "$PACKAGE==$VERSION"
  echo "$SHA256  $DIR/wheel/$WHEEL" | sha256sum -c --quiet
  "$python" - "$DIR/wheel/$WHEEL" "$DIR/lib" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("rocm/bindings/llvm/libLLVM.so") as src, \
        open(sys.argv[2] + "/libLLVM.so", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  rm -rf "$DIR/wheel"
  for lib in z zstd; do
    zstd=0; [[ $lib == zstd ]] && zstd=1
    cc -O2 -shared -fPIC -DSHIM_ZSTD=$zstd -Wl,--version-script=scripts/llvm23/sysdeps.map \
      -Wl,-soname,librocm_sysdeps_$lib.so.1 scripts/llvm23/sysdeps_shim.c -ldl \
      -o "$DIR/lib/librocm_sysdeps_$lib.so.1"
  done
  echo "$PACKAGE==$VERSION $SHA256" >"$stamp"
fi
say "$(scripts/llvm23/clang-llvm23 --version | head -1)"
