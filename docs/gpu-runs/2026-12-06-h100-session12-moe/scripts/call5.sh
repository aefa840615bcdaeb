#!/usr/bin/env bash
# Session 12, device call 5: MoE serving on the GPU, device vs host routing: an 8-layer
# Qwen3-30B-A3B-shaped Q4_K daemon, `civetta bench --remote` at concurrency 1, 4, 16 (64 tokens each).
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c5; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
xz -dc $G/s12/civetta-prev.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-8l.gguf
stamp synth
/tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 8 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o $M > /dev/null
for routing in true false; do
  stamp "serve, device routing $routing"
  CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
  CIVETTA_ENGINE__GPU__MOE_DEVICE_ROUTING=$routing setsid /tmp/g15/civetta serve -m $M --grpc-addr 127.0.0.1:50081 --metrics-addr 127.0.0.1:9581 > $O/serve-$routing.log 2>&1 < /dev/null &
  sp=$!
  for _ in $(seq 90); do grep -q listening $O/serve-$routing.log && break; sleep 1; done
  timeout 70 /tmp/g15/civetta bench --remote 127.0.0.1:50081 --concurrency 1,4,16 --requests 16 -n 64 -q -o md > $O/serving-$routing.md 2> $O/serving-$routing.err; cat $O/serving-$routing.md | head -12
  curl -s 127.0.0.1:9581/metrics | grep -E "^civetta_moe_expert_tokens_total" | head -3
  kill $sp; sleep 2
done
stamp done
