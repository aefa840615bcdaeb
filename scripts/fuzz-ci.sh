#!/usr/bin/env bash
# Bounded fuzzing for CI: every cargo-fuzz target in fuzz/ runs for FUZZ_SECONDS (default
# 60) on the stable toolchain (RUSTC_BOOTSTRAP=1 lets stable rustc take cargo-fuzz's -Z
# flags; no nightly needed). Seeds come from fuzz/corpus/TARGET (kept in the repository,
# read only here); what libFuzzer finds goes to a scratch corpus. A crash, panic, leak or
# timeout fails the script; the reproducer is left in fuzz/artifacts/TARGET/ and should
# become a regression test in tests/.
#
# Environment: FUZZ_SECONDS (per target, default 60), FUZZ_TARGETS (default: all),
# FUZZ_SANITIZER (address | none, default address), FUZZ_JOBS (cargo build jobs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
t0=$(date +%s)
seconds=${FUZZ_SECONDS:-60}
sanitizer=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1 CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-ci: installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked
fi
echo "fuzz-ci: $(cargo fuzz --version), $(rustc --version), sanitizer=$sanitizer, ${seconds}s per target"

targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# --debug-assertions: overflow checks and debug_assert! are part of what is fuzzed.
build_flags=(--sanitizer "$sanitizer" --debug-assertions)
[[ -n "${FUZZ_JOBS:-}" ]] && build_flags+=(--jobs "$FUZZ_JOBS")
for t in $targets; do
    if ! cargo fuzz build "${build_flags[@]}" "$t" >"$scratch/build.log" 2>&1; then
        tail -n 40 "$scratch/build.log"
        echo "fuzz-ci: building $t failed" >&2
        exit 1
    fi
done
echo "fuzz-ci: build $(($(date +%s) - t0))s"
bin_dir="fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/release"

status=0
for t in $targets; do
    mkdir -p "$scratch/$t" "fuzz/corpus/$t"
    log="$scratch/$t.log"
    s0=$(date +%s)
    # The binary cargo fuzz built, run directly (`cargo fuzz run` would check the build
    # again). The first corpus directory receives new inputs; the repository's is only read.
    mkdir -p "fuzz/artifacts/$t"
    if ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}" "$bin_dir/$t" -artifact_prefix="$root/fuzz/artifacts/$t/" \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 "$scratch/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
        tail -n 60 "$log"
        ls fuzz/artifacts/"$t"/ 2>/dev/null | sed "s|^|fuzz-ci: reproducer fuzz/artifacts/$t/|"
    fi
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
    cov=$(grep -oE '#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || echo 'cov: ?')
    units=$(find "$scratch/$t" -type f | wc -l)
    fuzzed=$(grep -oE '^Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' || echo '?')
    echo "fuzz-ci: $t $result: $runs runs in ${fuzzed}s ($(($(date +%s) - s0))s), $rate exec/s, $cov, $units new corpus inputs"
done
echo "fuzz-ci: total $(($(date +%s) - t0))s"
exit $status
