#!/usr/bin/env bash
# civetta vs llama.cpp CPU speed on the same model file, in one run (docs/PERF.md).
# Runs `civetta bench` and `llama-bench` back to back with the same thread count, prompt and
# generation sizes, and prints a markdown table of tokens/s and the civetta/llama.cpp ratio.
#
# usage: scripts/perf-vs-llamacpp.sh [THREADS] [PP] [TG] [REPS]   (default: 2 512 128 3)
# env: MODEL (default models/smollm2-135m-instruct-q4_1.gguf), LLAMA_CPP_DIR (build/llama.cpp),
#      OUT (folder for the raw JSON reports, default build/perf)
# Needs target/release/civetta (cargo build --release) and llama.cpp built by
# scripts/llama-cpp-reference.sh build. Nothing else should be running on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${1:-2}
PP=${2:-512}
TG=${3:-128}
REPS=${4:-3}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
LLAMA_BENCH=${LLAMA_CPP_DIR:-build/llama.cpp}/bin/llama-bench
CIVETTA=target/release/civetta
OUT=${OUT:-build/perf}

[[ -f "$MODEL" ]] || scripts/fetch-smollm2.sh
[[ -x "$LLAMA_BENCH" ]] || scripts/llama-cpp-reference.sh build
[[ -x "$CIVETTA" ]] || cargo build --release --bin civetta
mkdir -p "$OUT"

# Kernel timing and the bit-exactness hash runs are off: llama-bench has neither.
"$CIVETTA" bench -m "$MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" \
  --kernel-timing off --hash-tokens 0 -q -o json > "$OUT/civetta.json"
"$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" -o json > "$OUT/llama-bench.json" 2> "$OUT/llama-bench.log"

python3 - "$OUT/civetta.json" "$OUT/llama-bench.json" "$THREADS" "$PP" "$TG" "$REPS" <<'EOF'
import json, sys
civ_path, llama_path, threads, pp, tg, reps = sys.argv[1:]
civ = json.load(open(civ_path))
llama = json.load(open(llama_path))

def llama_tps(kind):
    for r in llama:
        if kind == "pp" and r["n_prompt"] > 0 and r["n_gen"] == 0:
            return r["avg_ts"], r["stddev_ts"]
        if kind == "tg" and r["n_gen"] > 0 and r["n_prompt"] == 0:
            return r["avg_ts"], r["stddev_ts"]
    raise SystemExit(f"no {kind} result in {llama_path}")

def civetta_tps(kind):
    for r in civ["tests"]:
        if r["kind"] == kind:
            return r["mean_tps"], r["stddev_tps"]
    raise SystemExit(f"no {kind} result in {civ_path}")

m = civ["model"]
print(f"model: {m['path']} (sha256 {m['file_sha256'][:12]}…, {m['quant_mix']}); threads {threads}; {reps} repetitions; "
      f"civetta {civ['civetta_version']} @ {civ['git_sha']}, SIMD {civ['fingerprint']['cpu_simd']}")
print()
print("| test | civetta t/s | llama.cpp t/s | civetta / llama.cpp |")
print("|---|---:|---:|---:|")
for kind, size in (("pp", pp), ("tg", tg)):
    c, cs = civetta_tps(kind)
    l, ls = llama_tps(kind)
    print(f"| {kind}{size} | {c:.1f} ± {cs:.1f} | {l:.1f} ± {ls:.1f} | {c / l:.2f}x |")
EOF
