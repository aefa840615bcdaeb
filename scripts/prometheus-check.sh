#!/usr/bin/env bash
# make test-prometheus: a real Prometheus (Debian package `prometheus`, run in the
# foreground on a loopback port, never as a service) against a live `civetta serve`;
# every query of the Grafana dashboard and the recording rules must parse and return
# data. The work is done by scripts/prometheus_check.py; this wrapper installs
# Prometheus when missing (as root) and builds the binaries.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
t0=$(date +%s)

if ! command -v prometheus >/dev/null; then
    [[ $(id -u) -eq 0 ]] || { echo "prometheus-check: install the Debian package prometheus" >&2; exit 1; }
    echo "installing prometheus (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package's init script may start a service on :9090; this check never uses it.
fi
echo "$(prometheus --version 2>&1 | head -1)"

if [[ -z "${CIVETTA_BIN:-}" ]]; then
    (cd "$root" && cargo build --release --bin civetta --example stream_client 2>&1 | tail -2)
fi
python3 "$here/prometheus_check.py" \
    --civetta "${CIVETTA_BIN:-$root/target/release/civetta}" \
    --client "${CIVETTA_CLIENT:-$root/target/release/examples/stream_client}" "$@"
echo "prometheus-check: $(( $(date +%s) - t0 ))s"
