#!/usr/bin/env bash
# #14: serving A/B on the idle Xeon host: before = main c3c1451 (64-row CPU budget), after = issue-14
# (engine.max_decode_slowdown, default 3 since the 2-core VM measurement in docs/PERF.md; this script was written for 2 and sets 3 and 0 as variants).
# Server `taskset -c 0,1` 2 threads, client on cores 4-7. SmolLM2-shaped synthetic Q4_1, context 4096,
# synthesised here. Rounds interleave: before, after | after, before; then (time allowing) the after
# binary at slowdown 3 and at 0 (off) on the mixed scenario. NEEDS AN IDLE HOST (no parallel build).
set -uo pipefail
R=$OUT/14; mkdir -p $R; W=/tmp/r14; mkdir -p $W
gunzip -c .gpu/14/civetta-after.gz > $W/after; gunzip -c .gpu/14/civetta-before.gz > $W/before; chmod +x $W/after $W/before
lscpu | grep -E "Model name|^CPU\(s\)" > $R/cpu.txt; uptime > $R/uptime-start.txt
M=$W/smollm2-shaped-q4_1.gguf
$W/after model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 \
  --vocab 49152 --tied --context 4096 --seed 1 -o $M > /dev/null
port=50140
serve() { # NAME BIN TAG [env...]
  local name=$1 bin=$2 tag=$3; shift 3
  port=$((port + 1))
  env CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=4096 "$@" \
    taskset -c 0,1 $bin serve -m $M --grpc-addr 127.0.0.1:$port --metrics-addr 127.0.0.1:0 --http-addr "" > $R/serve-$name-$tag.log 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q listening $R/serve-$name-$tag.log && break; sleep 0.2; done
}
levels() { # NAME TAG
  timeout 100 taskset -c 4-7 $W/after bench --remote 127.0.0.1:$port --concurrency 1,8,16 --requests 16 -n 64 -q \
    --json-out $R/$1-levels-$2.json -o md > $R/$1-levels-$2.md 2>$R/$1-levels-$2.err
}
mixed() { # NAME TAG
  timeout 130 taskset -c 4-7 $W/after bench --remote 127.0.0.1:$port --concurrency '' --mixed 3000 --mixed-stream-tokens 2048 -q \
    --json-out $R/$1-mixed-$2.json -o md > $R/$1-mixed-$2.md 2>$R/$1-mixed-$2.err
}
stop() { kill $pid; wait $pid 2>/dev/null; }
one() { # NAME BIN ROUND
  serve $1 $2 r$3; levels $1 r$3; mixed $1 r$3; stop; echo "$1 round $3 done at ${SECONDS}s"
}
one before $W/before 1
# round 1's after server logs every step (rows, attended KV positions, predicted/measured ms, plan)
serve after $W/after r1 CIVETTA_LOG__FILTER=civetta::engine::scheduler=trace CIVETTA_LOG__FORMAT=json; levels after r1; mixed after r1; stop
echo "after round 1 done at ${SECONDS}s"; gzip $R/serve-after-r1.log
one after $W/after 2; one before $W/before 2
if (( SECONDS < 330 )); then serve after $W/after f3 CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=3.0; mixed after f3; stop; echo "f3 done at ${SECONDS}s"; fi
if (( SECONDS < 380 )); then serve after $W/after f0 CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=0.0; mixed after f0; stop; echo "f0 done at ${SECONDS}s"; fi
uptime > $R/uptime-end.txt
python3 - $R <<'PY'
import json, sys, glob, os, statistics as st
R = sys.argv[1]
def load(pat):
    out = []
    for f in sorted(glob.glob(os.path.join(R, pat))):
        try: out.append((os.path.basename(f), json.load(open(f))))
        except Exception as e: print("unreadable", f, e)
    return out
for name in ["before", "after"]:
    lv = load(f"{name}-levels-r*.json")
    by = {}
    for f, rep in lv:
        for t in rep.get("remote", []): by.setdefault(t["concurrency"], []).append(t)
    for c in sorted(by):
        rows = by[c]
        print(f"{name} c{c} n={len(rows)} tok/s " + "/".join(f"{t['tokens_per_second']:.1f}" for t in rows)
              + f" med {st.median(t['tokens_per_second'] for t in rows):.1f} | TTFT p99 ms med {1e3*st.median(t['ttft_p99_s'] for t in rows):.0f}"
              + f" | ITL p50/p99 ms med {1e3*st.median(t['itl_p50_s'] for t in rows):.1f}/{1e3*st.median(t['itl_p99_s'] for t in rows):.1f}")
for f, rep in load("*-mixed-*.json"):
    for m in rep.get("mixed", []):
        print(f"{f}: long {m['long_prompt_tokens']} TTFT {m['long_ttft_s']*1e3:.0f} ms | idle p50/p99 {m['idle']['p50_s']*1e3:.1f}/{m['idle']['p99_s']*1e3:.1f}"
              f" | during n={m['during']['samples']} p50/p99 {m['during']['p50_s']*1e3:.1f}/{m['during']['p99_s']*1e3:.1f} | ratio {m['p99_ratio']} outlasted {m['streams_outlasted_prefill']} errors {m['errors']}")
PY
grep -il "fail\|error" $R/*.err 2>/dev/null | head
