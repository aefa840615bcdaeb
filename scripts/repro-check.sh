#!/usr/bin/env bash
# make test-repro (CI, after make test-containers built localhost/civetta:cpu from
# target/release/civetta): `civetta repro run --layers host,podman` on SmolLM2 with a short
# bench, then `civetta repro check`: both cells ran, each with its own fingerprint (the
# podman cell's says container podman), and a layer-overhead row.
# Env: CIVETTA_BIN (default target/release/civetta: the binary the image was built from),
#      IMAGE_NAME (localhost/civetta:cpu), MODEL (models/default.gguf), OUT (target/repro-ci.json).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/containers-lib.sh"   # CONTAINERS_CONF: runc and ulimits that work on these VMs

bin="${CIVETTA_BIN:-$root/target/release/civetta}"
image="${IMAGE_NAME:-localhost/civetta:cpu}"
model="${MODEL:-$root/models/default.gguf}"
out="${OUT:-$root/target/repro-ci.json}"
[[ -x "$bin" ]] || { echo "repro-check: no civetta binary at $bin" >&2; exit 1; }
[[ -f "$model" ]] || { echo "repro-check: no model at $model (scripts/fetch-smollm2.sh)" >&2; exit 1; }
podman image exists "$image" || { echo "repro-check: no image $image (make image-cpu)" >&2; exit 1; }

# 2 rounds x 2 repetitions, pp32/tg16, 8 hashed tokens: about half a minute on 2 cores.
"$bin" repro run --layers host,podman --image "$image" --rounds 2 -o "$out" \
    -- -m "$model" -p 32 -n 16 -r 2 --warmup 1 --hash-tokens 8
"$bin" repro check "$out" --layers host,podman
