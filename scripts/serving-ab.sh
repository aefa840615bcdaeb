#!/usr/bin/env bash
# Serving A/B on the CPU backend (docs/PERF.md, "Serving"): two civetta binaries, each serving
# a SmolLM2-shaped synthetic Q4_1 model on 2 pinned cores, measured from a separate client
# process (`civetta bench --remote`) on other cores; rounds interleave A, B, B, A.
#
# usage: scripts/serving-ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]   env: OUT (build/serving-ab),
#        SERVER_CPUS (0,1), CLIENT_CPUS (4-7), LEVELS (1,2,4,8,16), REQUESTS (16), TOKENS (64),
#        MIXED (0 = off; N: also #14's mixed scenario, a N-token prompt while 4 streams decode),
#        MIXED_CONTROL (non-empty: the mixed scenario also runs its streams alone, `--mixed-control`),
#        SERVER_ENV (extra VAR=value settings of both servers, e.g. CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=3.0)
set -euo pipefail
before=$1 after=$2 rounds=${3:-2}
OUT=${OUT:-build/serving-ab}
SERVER_CPUS=${SERVER_CPUS:-0,1} CLIENT_CPUS=${CLIENT_CPUS:-4-7}
LEVELS=${LEVELS:-1,2,4,8,16} REQUESTS=${REQUESTS:-16} TOKENS=${TOKENS:-64} MIXED=${MIXED:-0} SERVER_ENV=${SERVER_ENV:-}
mkdir -p "$OUT"
model=$OUT/smollm2-shaped-q4_1.gguf
[[ -f $model ]] || "$after" model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 \
  --heads 9 --kv-heads 3 --vocab 49152 --tied --context 4096 --seed 1 -o "$model" >/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"

run() { # NAME BIN ROUND
  local name=$1 bin=$2 round=$3
  local port=$((50100 + round * 2 + $([[ $name == after ]] && echo 1 || echo 0)))
  # shellcheck disable=SC2086 # SERVER_ENV is a list of VAR=value words
  env CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 \
    CIVETTA_ENGINE__CONTEXT_LENGTH=4096 $SERVER_ENV \
    taskset -c "$SERVER_CPUS" "$bin" serve -m "$model" --grpc-addr 127.0.0.1:$port --metrics-addr 127.0.0.1:0 \
    > "$OUT/serve-$name-$round.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q listening "$OUT/serve-$name-$round.log" && break; sleep 0.2; done
  taskset -c "$CLIENT_CPUS" "$after" bench --remote 127.0.0.1:$port --concurrency "$LEVELS" --requests "$REQUESTS" \
    -n "$TOKENS" -q -o json > "$OUT/$name-$round.json"
  if (( MIXED > 0 )); then
    taskset -c "$CLIENT_CPUS" "$after" bench --remote 127.0.0.1:$port --concurrency '' --mixed "$MIXED" \
      --mixed-stream-tokens 2048 ${MIXED_CONTROL:+--mixed-control} -q -o json > "$OUT/$name-mixed-$round.json"
  fi
  kill $pid; wait $pid 2>/dev/null || true
  echo "$name round $round done"
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then run before "$before" "$r"; run after "$after" "$r"; else run after "$after" "$r"; run before "$before" "$r"; fi
done
python3 - "$OUT" "$rounds" <<'PY'
import json, sys, statistics as st
out, rounds = sys.argv[1], int(sys.argv[2])
def levels(name):
    rows = {}
    for r in range(1, rounds + 1):
        rep = json.load(open(f"{out}/{name}-{r}.json"))
        for t in rep["remote"]:
            rows.setdefault(t["concurrency"], []).append(t)
    return rows
b, a = levels("before"), levels("after")
key = lambda t, *ks: next(t[k] for k in ks if k in t)
print("| conc. | before tok/s | after tok/s | after/before | before TTFT p99 ms | after TTFT p99 ms | before ITL p99 ms | after ITL p99 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in sorted(a):
    med = lambda rows, *ks: st.median(key(t, *ks) for t in rows)
    tb, ta = med(b[c], "tokens_per_second"), med(a[c], "tokens_per_second")
    ms = lambda rows, k: 1e3 * med(rows, k)
    print(f"| {c} | {tb:.1f} | {ta:.1f} | {ta/tb:.2f}x | {ms(b[c], 'ttft_p99_s'):.0f} | {ms(a[c], 'ttft_p99_s'):.0f} | {ms(b[c], 'itl_p99_s'):.1f} | {ms(a[c], 'itl_p99_s'):.1f} |")
import glob, os
mixed = {n: [m for f in sorted(glob.glob(f"{out}/{n}-mixed-*.json")) for m in json.load(open(f)).get("mixed", [])] for n in ("before", "after")}
if mixed["before"] or mixed["after"]:
    print()
    print("| server | long prompt tokens | long TTFT ms | idle ITL p99 ms | during ITL p50 ms | during ITL p99 ms | p99 during/idle | control ITL p99 ms | p99 during/control |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, ms_ in mixed.items():
        for m in ms_:
            ratio = f"{m['p99_ratio']:.2f}x" if m.get("p99_ratio") else "-"
            c = m.get("control")
            control = f"{1e3*c['p99_s']:.1f}" if c else "-"
            vs_control = f"{m['p99_ratio_control']:.2f}x" if m.get("p99_ratio_control") else "-"
            print(f"| {n} | {m['long_prompt_tokens']} | {1e3*m['long_ttft_s']:.0f} | {1e3*m['idle']['p99_s']:.1f} | {1e3*m['during']['p50_s']:.1f} | {1e3*m['during']['p99_s']:.1f} | {ratio} | {control} | {vs_control} |")
PY
