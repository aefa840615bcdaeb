#!/usr/bin/env bash
# Builds llama.cpp (CPU only, no AMX) from the llama-cpp-python sdist on PyPI, then uses it to
# write tests/fixtures/smollm2/reference.json: llama.cpp's token ids for a set of tokenizer test
# strings and its greedy continuations of fixed chat prompts on the SmolLM2-135M model.
#
# usage: scripts/llama-cpp-reference.sh [build|reference|all|gemma3]   (default: all)
#   build      only build llama.cpp into build/llama.cpp (skipped when the same source is built)
#   reference  build if needed, then regenerate the reference file
#   gemma3     build if needed, then write tests/fixtures/gemma3/reference.json from the real
#              Gemma 3 270M Q4_K_M file (scripts/fetch-gemma3.sh; scripts/llama_cpp_reference_gemma3.py)
# env: LLAMA_CPP_DIR (default build/llama.cpp), MODEL (default models/smollm2-135m-instruct-q4_1.gguf),
#      JOBS (default: nproc)
#
# The build is cached by the sha256 of the sdist and the ISA flags chosen from /proc/cpuinfo
# (AVX-512 where the CPU has it, AVX2 otherwise): bin/ plus a stamp file naming that hash.
# AMX stays off: these machines advertise AMX in CPUID but fault on its instructions.
set -euo pipefail

VERSION=0.3.36
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${LLAMA_CPP_DIR:-build/llama.cpp}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
JOBS=${JOBS:-$(nproc)}
OUT_JSON=tests/fixtures/smollm2/reference.json
MODE=${1:-all}

build_llama_cpp() {
  mkdir -p "$DIR/download"
  local sdist="$DIR/download/llama_cpp_python-$VERSION.tar.gz"
  if [[ ! -f "$sdist" ]]; then
    # --no-binary for this package only; pip prepares metadata but builds nothing.
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$VERSION" -d "$DIR/download"
  fi
  [[ -f "$sdist" ]] || { echo "pip did not produce $sdist" >&2; exit 1; }
  # ISA flags from this CPU (GGML_NATIVE would also enable AMX, which faults here): the
  # AVX-512 kernels where the CPU has them, AVX2 otherwise. The cache key includes them.
  local isa=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  if grep -qw avx512f /proc/cpuinfo && grep -qw avx512_vnni /proc/cpuinfo; then
    isa+=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
  else
    isa+=(-DGGML_AVX512=OFF)
  fi
  local hash
  hash=$( (sha256sum "$sdist" | cut -d' ' -f1; echo "${isa[*]}") | sha256sum | cut -d' ' -f1)
  if [[ -f "$DIR/built-$hash" && -x "$DIR/bin/llama-bench" ]]; then
    echo "llama.cpp (${isa[*]}) already built in $DIR/bin"
    return
  fi
  command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)" >&2; exit 1; }

  rm -rf "$DIR/src" "$DIR/cmake-build" "$DIR/bin" "$DIR"/built-*
  mkdir -p "$DIR/src"
  tar -xzf "$sdist" -C "$DIR/src" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
  touch "$DIR/src/ggml/ggml.pc.in"   # missing from the vendored tree, needed by cmake install rules

  cmake -S "$DIR/src" -B "$DIR/cmake-build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF "${isa[@]}" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  cmake --build "$DIR/cmake-build" -j "$JOBS" \
    --target llama-simple llama-tokenize llama-bench llama-completion
  mkdir -p "$DIR/bin"
  for t in llama-simple llama-tokenize llama-bench llama-completion; do
    cp "$DIR/cmake-build/bin/$t" "$DIR/bin/"
  done
  touch "$DIR/built-$hash"
  echo "llama.cpp built into $DIR/bin"
}

# Our greedy driver (scripts/llama_cpp_greedy.cpp) over llama.cpp's static libraries: it prints
# token ids, which llama-simple / llama-completion do not.
build_greedy_driver() {
  local src=scripts/llama_cpp_greedy.cpp exe="$DIR/bin/llama-cpp-greedy"
  [[ -x "$exe" && "$exe" -nt "$src" ]] && return
  local libs
  libs=$(find "$DIR/cmake-build" -name 'libllama.a' -o -name 'libggml*.a' | sort -r)
  # libllama first, then ggml's cpu/backend parts before ggml-base (static link order).
  g++ -O2 -std=c++17 -I "$DIR/src/include" -I "$DIR/src/ggml/include" "$src" -o "$exe" \
    "$DIR/cmake-build/src/libllama.a" \
    $(echo "$libs" | grep -v libllama.a | grep -v ggml-base) \
    $(echo "$libs" | grep ggml-base) -fopenmp -lpthread -ldl
  echo "built $exe"
}

case "$MODE" in
  build) build_llama_cpp; build_greedy_driver ;;
  reference|all)
    build_llama_cpp
    build_greedy_driver
    [[ -f "$MODEL" ]] || scripts/fetch-smollm2.sh
    python3 "$ROOT/scripts/llama_cpp_reference.py" --bin "$DIR/bin" --model "$MODEL" --out "$OUT_JSON"
    ;;
  gemma3)
    build_llama_cpp
    build_greedy_driver
    GEMMA=models/gemma-3-270m-q4_k_m.gguf
    [[ -f "$GEMMA" ]] || scripts/fetch-gemma3.sh "$GEMMA"
    python3 "$ROOT/scripts/llama_cpp_reference_gemma3.py" --bin "$DIR/bin" --model "$GEMMA" \
      --out tests/fixtures/gemma3/reference.json
    ;;
  *) echo "usage: $0 [build|reference|all|gemma3]" >&2; exit 2 ;;
esac
