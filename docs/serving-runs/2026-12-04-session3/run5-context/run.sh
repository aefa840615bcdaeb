#!/usr/bin/env bash
# Does the model's context length change c1 serving speed? (run 3: ctx 2048 -> 230 t/s, run 4: ctx 4096 -> 87 t/s)
set -uo pipefail
R=$OUT/20; mkdir -p $R; W=/tmp/r20; mkdir -p $W
B=$W/civetta; cp .gpu/19/civetta $B && chmod +x $B
lscpu > $R/lscpu.txt
for c in 2048 4096; do
  $B model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied --context $c --seed 1 -o $W/m$c.gguf > /dev/null
done
serve_bench() { # ctx engine_ctx tag
  CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=$2 \
    taskset -c 0,1 $B serve -m $W/m$1.gguf --grpc-addr 127.0.0.1:50130 --metrics-addr 127.0.0.1:0 --http-addr "" > $R/serve-$3.log 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q listening $R/serve-$3.log && break; sleep 0.2; done
  timeout 60 taskset -c 4-7 $B bench --remote 127.0.0.1:50130 --concurrency 1 --requests 8 -n 64 -q -o md 2>/dev/null | grep "| grpc" | sed "s/^/$3 /"
  kill $pid; wait $pid 2>/dev/null
}
for r in 1 2; do
  serve_bench 2048 4096 ctx2048
  serve_bench 4096 4096 ctx4096
  serve_bench 4096 2048 ctx4096-engine2048
done
for c in 2048 4096; do taskset -c 0,1 $B bench -m $W/m$c.gguf -t 2 -p 128 -n 64 -r 2 --hash-tokens 0 --kernel-timing off -q -o md 2>/dev/null | grep -E "^\| (pp|tg)" | sed "s/^/local ctx$c /"; done
grep -E "Model name|MHz|L3" $R/lscpu.txt
