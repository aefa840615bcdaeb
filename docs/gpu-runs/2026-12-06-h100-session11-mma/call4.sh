#!/usr/bin/env bash
# Session 11, device call 4: main 8e2826f (engine.gpu.matvec_mma on by default, MMA_MIN_ROWS 4) with
# its defaults: serving the 1.4B Q8_0 model at concurrency 1,8,16, then gpu_check on llama / qwen3.
set -uo pipefail
B=.gpu/mma2; K=$B/kernels/sm_90; M=/tmp/gpu-mma; mkdir -p $M
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -f $M/m-q8_0.gguf ]] || $B/civetta model synth $SZ --quant q8_0 -o $M/m-q8_0.gguf > /dev/null
CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
  $B/civetta serve -m $M/m-q8_0.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $OUT/serve.log 2>&1 &
pid=$!
for _ in $(seq 90); do grep -q listening $OUT/serve.log && break; sleep 1; done
addr=$(grep -o "grpc=[0-9.:]*" $OUT/serve.log | head -1 | cut -d= -f2)
for r in 1 2; do
  timeout 90 $B/civetta bench --remote "$addr" --concurrency 1,8,16 --requests 32 -n 64 -q -o json > $OUT/serving-$r.json
  python3 -c "
import json; r=json.load(open('$OUT/serving-$r.json'))['remote']; b=r[0]['tokens_per_second']
print('; '.join(f\"c{x['concurrency']} {x['tokens_per_second']:.1f} t/s ({x['tokens_per_second']/b:.2f}x) ITL p50 {x['itl_p50_s']*1e3:.2f} ms\" for x in r))"
done
kill $pid; wait $pid 2>/dev/null
timeout 120 $B/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3 --quants q8_0,q4_k > $OUT/parity-default.md 2>&1
grep -E "^\| [a-z]" $OUT/parity-default.md | cut -c1-200
