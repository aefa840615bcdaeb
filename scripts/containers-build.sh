#!/usr/bin/env bash
# Build one image of containers/matrix.toml: scripts/containers-build.sh <tag>
#   cpu                        -> scripts/containers-build-cpu.sh (no registry needed)
#   rocm-<rocm>-clang<N>[-toolbox] -> podman build of containers/Containerfile.<tag> from the
#                                 repository root; needs the network (base image pull,
#                                 repo.radeon.com / TheRock, rustup), so not in CI.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/containers-lib.sh"

tag="${1:?usage: containers-build.sh <tag> (see containers/matrix.toml)}"
if [[ "$tag" == cpu ]]; then
    exec "$here/containers-build-cpu.sh"
fi
file="$root/containers/Containerfile.$tag"
[[ -f "$file" ]] || { echo "containers: no $file; tags: $(python3 "$here/containers-gen.py" --list | tr '\n' ' ')" >&2; exit 2; }

civetta_dirty_note "$root"
podman build --format docker --ignorefile "$root/containers/containerignore" \
    --build-arg CIVETTA_REVISION="$(civetta_revision "$root")" \
    --build-arg CIVETTA_VERSION="$(civetta_version "$root")" \
    --build-arg CIVETTA_CREATED="$(civetta_created "$root")" \
    -t "localhost/civetta:$tag" -f "$file" "$root"
