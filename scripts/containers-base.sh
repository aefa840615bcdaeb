#!/usr/bin/env bash
# Build the local base image localhost/debian:bookworm-min from Debian packages
# (debootstrap --variant=minbase + podman import), so no registry is needed.
# Cached twice: the image itself (skipped when present) and the rootfs tarball
# under $CIVETTA_CACHE_DIR (re-imported without debootstrap).
#
# Env: DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SUITE
# (default bookworm), CIVETTA_CACHE_DIR (default ~/.cache/civetta), FORCE=1 rebuilds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/containers-lib.sh"

suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache_dir="${CIVETTA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/civetta}"
tarball="$cache_dir/debian-$suite-minbase.tar"
image="$CIVETTA_BASE_IMAGE"

if [[ "${FORCE:-0}" != 1 ]] && podman image exists "$image"; then
    echo "base image $image already present"
    exit 0
fi

if [[ "${FORCE:-0}" == 1 || ! -s "$tarball" ]]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    mkdir -p "$cache_dir"
    rootfs="$(mktemp -d "${TMPDIR:-/tmp}/civetta-rootfs.XXXXXX")"
    trap 'rm -rf "$rootfs"' EXIT
    echo "debootstrap --variant=minbase $suite from $mirror"
    debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$cache_dir/debootstrap.log" 2>&1 \
        || { tail -20 "$cache_dir/debootstrap.log" >&2; exit 1; }
    # Trim what a runtime base does not need; keep dpkg/apt so images can add packages.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
fi

podman import --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
echo "imported $image from $tarball"
