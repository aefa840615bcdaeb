#!/usr/bin/env bash
# Session 22, call c3 (#14): the GPU mixed scenario, traced. c1 measured a 3000-token prompt's first
# token at 8.2 s on the H100 while 4 streams decode (pp2048 of this model is ~39k t/s). The engine's
# step trace (rows, attended positions, predicted and measured ms per step) with the default
# max_decode_slowdown (3), then with it off (0: chunks fill the 2048-row budget).
set -uo pipefail
G=$PWD/.gpu/22; W=/tmp/s22; mkdir -p $W; T=${TAG:-c3}; O=$OUT/$T; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/$T.tgz -C $OUT $T; }
trap finish EXIT
for b in civetta; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
for sd in 3 0; do
  stamp "mixed, max_decode_slowdown $sd"
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=$sd \
    CIVETTA_LOG=info,civetta::engine::scheduler=trace \
    $W/civetta serve -m $W/dense.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-sd$sd.log 2>&1 &
  pid=$!
  for _ in $(seq 120); do grep -q listening $O/serve-sd$sd.log && break; sleep 0.5; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-sd$sd.log | head -1 | cut -d= -f2)
  timeout 100 $W/civetta bench --remote "$addr" --concurrency= --mixed 3000 --mixed-streams 4 -q -o json > $O/mixed-sd$sd.json 2> $O/mixed-sd$sd.err || echo "BENCH FAILED"
  kill $pid; wait $pid 2>/dev/null
  python3 - $O/mixed-sd$sd.json $O/serve-sd$sd.log <<'PY'
import json, sys, re
d = json.load(open(sys.argv[1]))
for m in d.get("mixed") or []:
    print("long_ttft %.3f s idle p50/p99 %.2f/%.2f ms during p50/p99 %.2f/%.2f ms (n=%d)" % (m["long_ttft_s"], 1e3 * m["idle"]["p50_s"], 1e3 * m["idle"]["p99_s"], 1e3 * m["during"]["p50_s"], 1e3 * m["during"]["p99_s"], m["during"]["samples"]))
steps = [l for l in open(sys.argv[2]) if "scheduler: step" in l]
mixed = [l for l in steps if "Prefill" in l and "Decode" in l]
print(len(steps), "steps,", len(mixed), "mixed")
for l in mixed[:5] + mixed[len(mixed) // 2:len(mixed) // 2 + 3] + mixed[-3:]:
    print(re.sub(r" states=.*", "", l.split("scheduler: ")[1]).strip()[:230])
PY
done
gzip -f $O/serve-sd*.log
stamp done
