#!/usr/bin/env bash
# make test-containers: build the CPU image with podman and check it for real.
#   1. podman and friends present (apt-get install when missing and running as root),
#      podman able to run a container here;
#   2. base image (debootstrap + podman import, cached) and localhost/civetta:cpu;
#   3. the container started with loopback-published ports: a gRPC Generate through
#      the stream_client example, a /metrics scrape that counts it, the image's
#      HEALTHCHECK, `civetta env --json` inside reporting container podman and the
#      image tag, the non-root user and the revision label;
#   4. deploy/kubernetes/civetta-cpu.yaml through `podman kube play` (skip: KUBE=0).
# Env: CIVETTA_BIN / CIVETTA_CLIENT (prebuilt binaries: no cargo build), IMAGE_NAME, KUBE.
# Everything it starts is removed on exit. Prints the time of each step.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
t0=$(date +%s)
step() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
fail() { echo "test-containers: FAIL: $*" >&2; exit 1; }

image="${IMAGE_NAME:-localhost/civetta:cpu}"
export IMAGE_NAME="$image"

# ---- 1. tools ---------------------------------------------------------------
step "tools"
missing=()
for tool in podman:podman runc:runc debootstrap:debootstrap slirp4netns:slirp4netns \
            fuse-overlayfs:fuse-overlayfs newuidmap:uidmap curl:curl objcopy:binutils; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        fail "missing packages: ${missing[*]} (apt-get install ${missing[*]})"
    fi
    echo "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        podman buildah runc fuse-overlayfs slirp4netns uidmap debootstrap curl binutils >/dev/null
fi
source "$here/containers-lib.sh"
runtime="$(podman info --format '{{.Host.OCIRuntime.Name}}')" || fail "podman info failed"
echo "podman $(podman version --format '{{.Client.Version}}'), runtime $runtime, CONTAINERS_CONF=$CONTAINERS_CONF"

# ---- 2. images --------------------------------------------------------------
# CIVETTA_BIN and CIVETTA_CLIENT name prebuilt binaries and skip the cargo build.
bin="${CIVETTA_BIN:-$root/target/release/civetta}"
client="${CIVETTA_CLIENT:-$root/target/release/examples/stream_client}"
if [[ -z "${CIVETTA_BIN:-}" ]]; then
    step "release build (civetta + stream_client example)"
    (cd "$root" && cargo build --release --bin civetta --example stream_client 2>&1 | tail -3)
fi
[[ -x "$bin" ]] || fail "no $bin"
[[ -x "$client" ]] || fail "no $client"

step "base image + CPU image"
CIVETTA_BIN="$bin" "$here/containers-build-cpu.sh" 2>&1 | grep -vE '^(Copying|Writing|Storing|Getting)' | tail -15
podman image exists "$image" || fail "image $image was not built"

# ---- 3. run it ----------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port="$(free_port)"; metrics_port="$(free_port)"
name="civetta-test-$$"
kube_pod=""
# podman logs "unable to get systemd connection" for HEALTHCHECK timers on hosts without
# systemd; harmless (podman healthcheck run still works), so its stderr goes to a log.
logdir="$(mktemp -d "${TMPDIR:-/tmp}/civetta-test-containers.XXXXXX")"
cleanup() {
    podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
    rm -rf "$logdir"
    if [[ -n "$kube_pod" ]]; then
        podman kube down "$root/deploy/kubernetes/civetta-cpu.yaml" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

step "podman run (gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port)"
podman run -d --init --pull=never --name "$name" \
    -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" "$image" >/dev/null 2>"$logdir/run.err" \
    || { cat "$logdir/run.err" >&2; fail "podman run failed"; }

wait_metrics() {  # url, seconds
    local deadline=$(( $(date +%s) + $2 ))
    until curl -fsS -o /dev/null "$1"; do
        (( $(date +%s) < deadline )) || return 1
        sleep 0.5
    done
}
wait_metrics "http://127.0.0.1:$metrics_port/metrics" 60 || {
    podman logs "$name" | tail -20 >&2
    fail "no /metrics from the container within 60 s"
}

step "gRPC Generate through the published port"
reply="$("$client" --addr "http://127.0.0.1:$grpc_port" --prompt hi --max-tokens 8 2>&1)" || {
    echo "$reply" >&2; fail "stream_client failed against the container"
}
echo "$reply" | tail -3

step "/metrics scrape"
metrics="$(curl -fsS "http://127.0.0.1:$metrics_port/metrics")"
grep -qE '^civetta_requests_total\{[^}]*rpc="Generate"[^}]*\} [1-9]' <<<"$metrics" \
    || fail "civetta_requests_total{rpc=\"Generate\"} did not count the request: $(grep '^civetta_requests_total' <<<"$metrics")"
grep -qE '^civetta_generated_tokens_total [1-9]' <<<"$metrics" || fail "no generated tokens counted"
grep -qE '^civetta_build_info\{' <<<"$metrics" || fail "no civetta_build_info"
grep -E '^civetta_environment_info\{' <<<"$metrics" | grep -q 'container="podman"' \
    || fail "civetta_environment_info does not say container=\"podman\": $(grep '^civetta_environment_info' <<<"$metrics")"
echo "ok: request counted, build/environment info with container=\"podman\""

step "HEALTHCHECK (podman healthcheck run)"
podman healthcheck run "$name" 2>>"$logdir/run.err" || fail "the image's HEALTHCHECK failed"
echo "ok: healthy"

step "civetta env --json inside the container"
env_json="$(podman exec "$name" civetta env --json)" || fail "civetta env --json failed inside the container"
python3 - "$env_json" <<'PY' || fail "civetta env --json does not report container podman / the image"
import json, sys
env = json.loads(sys.argv[1])

def lookup(doc, dotted):
    """A dotted key of the fingerprint: its `fields` list ([{key, value, source}]),
    else a flat {"container.type": v} or nested {"container": {"type": v}} layout."""
    for field in doc.get("fields", []) if isinstance(doc.get("fields"), list) else []:
        if field.get("key") == dotted:
            return field.get("value")
    if dotted in doc:
        return doc[dotted]
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node

container = lookup(env, "container.type")
image = lookup(env, "container.image")
print("container.type:", container, "| container.image:", image)
assert container == "podman", f"container.type is {container!r}"
assert image == "civetta:cpu", f"container.image is {image!r}, expected the tag from /etc/civetta/image.json"
PY

step "non-root user, image.json and labels"
uid="$(podman exec "$name" id -u)"
[[ "$uid" != 0 ]] || fail "the container runs as root"
image_json="$(podman exec "$name" cat /etc/civetta/image.json)"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["tag"]=="civetta:cpu", d; assert len(d["revision"])==40, d' \
    "$image_json" || fail "bad /etc/civetta/image.json: $image_json"
revision="$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$image")"
[[ "$revision" == "$(git -C "$root" rev-parse HEAD)" ]] || fail "revision label $revision is not HEAD"
echo "ok: uid $uid, image.json tag civetta:cpu, revision $revision"

podman rm -f -t 0 "$name" >/dev/null 2>&1

# ---- 4. podman kube play ------------------------------------------------------
if [[ "${KUBE:-1}" == 1 ]]; then
    step "podman kube play deploy/kubernetes/civetta-cpu.yaml"
    kube_pod=1
    podman kube play --replace "$root/deploy/kubernetes/civetta-cpu.yaml" >/dev/null 2>"$logdir/kube.err" \
        || { cat "$logdir/kube.err" >&2; fail "podman kube play failed"; }
    # A Deployment becomes pod <name>-pod-0 with container <pod>-<container>.
    ctr=civetta-cpu-pod-0-civetta
    infra="$(podman pod inspect --format '{{.InfraContainerID}}' civetta-cpu-pod-0)" || fail "no pod civetta-cpu-pod-0"
    ip="$(podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$infra")"
    [[ -n "$ip" ]] || fail "no pod IP for the kube play pod"
    wait_metrics "http://$ip:9464/metrics" 60 || fail "no /metrics from the kube play pod at $ip:9464"
    "$client" --addr "http://$ip:50051" --prompt hi --max-tokens 4 >/dev/null || fail "gRPC against the kube play pod failed"
    [[ "$(podman exec "$ctr" id -u)" == 10001 ]] || fail "kube play pod does not run as uid 10001"
    podman healthcheck run "$ctr" >/dev/null 2>&1 || fail "the liveness probe (as podman healthcheck) failed"
    echo "ok: kube play pod at $ip serves gRPC and /metrics as uid 10001, liveness probe passes"
    podman kube down "$root/deploy/kubernetes/civetta-cpu.yaml" >/dev/null 2>&1
    kube_pod=""
fi

step "PASS (image $image: $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
