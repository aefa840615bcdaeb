#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf with .inp/.out pairs)
# from the llama-cpp-python source distribution on PyPI, for tests/tokenizer_llama_vectors.rs.
#
# usage: scripts/fetch-vocab-tests.sh [DIR]   (default: build/vocab-tests, or $CIVETTA_VOCAB_DIR)
# The files land flat in DIR; nothing is done when DIR already has them.
set -euo pipefail

VERSION=0.3.36
cd "$(dirname "$0")/.."
DIR=${1:-${CIVETTA_VOCAB_DIR:-build/vocab-tests}}
STAMP="$DIR/.llama-cpp-python-$VERSION"

if [[ -f "$STAMP" ]]; then
  echo "vocab tests already in $DIR"
  exit 0
fi

mkdir -p "$DIR"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --no-binary for this package only: its build dependencies (cmake, ninja) may come as wheels;
# pip still prepares the sdist's metadata, which needs those wheels but builds nothing.
python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
  "llama-cpp-python==$VERSION" -d "$TMP"

SDIST="$TMP/llama_cpp_python-$VERSION.tar.gz"
[[ -f "$SDIST" ]] || { echo "pip did not produce $SDIST" >&2; exit 1; }

PREFIX="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
tar -xzf "$SDIST" -C "$TMP" --wildcards "$PREFIX/ggml-vocab-*"
mv "$TMP/$PREFIX"/ggml-vocab-* "$DIR"/
touch "$STAMP"
echo "extracted $(ls "$DIR" | wc -l) files into $DIR"
