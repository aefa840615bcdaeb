#!/usr/bin/env bash
# Session 11, device call 5: serving A/B on one machine, kernel timing off: A = acc207c with
# CIVETTA_ENGINE__GPU__MATVEC_MMA=true (MMA_MIN_ROWS 2, call 3's binary), B = 8e2826f's defaults
# (mma on, MMA_MIN_ROWS 4, call 4's binary); 1.4B Q8_0, concurrency 1,8,16, rounds A B B A.
set -uo pipefail
M=/tmp/gpu-mma; mkdir -p $M
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -f $M/m-q8_0.gguf ]] || .gpu/mma2/civetta model synth $SZ --quant q8_0 -o $M/m-q8_0.gguf > /dev/null
run() { # NAME DIR
  local name=$1 B=$2
  CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false CIVETTA_ENGINE__GPU__MATVEC_MMA=true CIVETTA_ENGINE__BACKEND=cuda \
    CIVETTA_ENGINE__GPU__KERNEL_DIR=$B/kernels/sm_90 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    $B/civetta serve -m $M/m-q8_0.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $OUT/serve-$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 90); do grep -q listening $OUT/serve-$name.log && break; sleep 1; done
  local addr; addr=$(grep -o "grpc=[0-9.:]*" $OUT/serve-$name.log | head -1 | cut -d= -f2)
  timeout 60 $B/civetta bench --remote "$addr" --concurrency 1,8,16 --requests 32 -n 64 -q -o json > $OUT/serving-$name.json
  python3 -c "
import json; r=json.load(open('$OUT/serving-$name.json'))['remote']; b=r[0]['tokens_per_second']
print('$name: ' + '; '.join(f\"c{x['concurrency']} {x['tokens_per_second']:.1f} t/s ({x['tokens_per_second']/b:.2f}x)\" for x in r))"
  kill $pid; wait $pid 2>/dev/null
}
run A1 .gpu/mma; run B1 .gpu/mma2; run B2 .gpu/mma2; run A2 .gpu/mma
