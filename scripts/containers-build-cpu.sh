#!/usr/bin/env bash
# Build localhost/civetta:cpu (containers/Containerfile.cpu) without any registry:
#   1. the base localhost/debian:bookworm-min (scripts/containers-base.sh, cached),
#   2. a prebuilt release binary (cargo build --release unless CIVETTA_BIN is given),
#      checked to need no newer glibc than the base has,
#   3. podman build from a small staging context holding just that binary.
# Env: CIVETTA_BIN (default target/release/civetta), IMAGE_NAME (default localhost/civetta:cpu).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/containers-lib.sh"

image="${IMAGE_NAME:-localhost/civetta:cpu}"
bin="${CIVETTA_BIN:-$root/target/release/civetta}"

"$here/containers-base.sh"

if [[ -z "${CIVETTA_BIN:-}" ]]; then
    (cd "$root" && cargo build --release --bin civetta)
fi
[[ -x "$bin" ]] || { echo "containers: no civetta binary at $bin" >&2; exit 1; }

# The binary links the host glibc dynamically; the base must be at least as new.
need="$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)"
have="$(podman run --rm --pull=never "$CIVETTA_BASE_IMAGE" dpkg-query -W -f='${Version}' libc6 | cut -d- -f1)"
if [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -1)" != "$have" ]]; then
    echo "containers: $bin needs glibc $need but $CIVETTA_BASE_IMAGE has $have" >&2
    exit 1
fi
echo "glibc: binary needs $need, base has $have"

context="$root/target/containers/cpu-context"
rm -rf "$context" && mkdir -p "$context"
# Debug info stays on the host; symbols stay for backtraces.
objcopy --strip-debug "$bin" "$context/civetta"

civetta_dirty_note "$root"
podman build --pull=never --format docker \
    --build-arg CIVETTA_REVISION="$(civetta_revision "$root")" \
    --build-arg CIVETTA_VERSION="$(civetta_version "$root")" \
    --build-arg CIVETTA_CREATED="$(civetta_created "$root")" \
    -t "$image" -f "$root/containers/Containerfile.cpu" "$context"
echo "built $image"
