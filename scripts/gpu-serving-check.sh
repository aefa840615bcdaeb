#!/usr/bin/env bash
# Continuous batching on an NVIDIA machine (docs/GPU.md, "Batching"): parity of the GPU
# backend with the CPU one, batch vs solo on the GPU included (examples/gpu_check.rs), then the
# aggregate tokens/s of a CUDA daemon at concurrency 1..16 measured from a separate client
# process (`civetta bench --remote`) on the 1.4B synthetic model of scripts/gpu-check.sh.
#
# Needs the folder that `scripts/gpu-check.sh prepare` makes (civetta and gpu_check built with
# --features cuda, kernels/sm_90/*.ptx). env: GPU_DIR (.gpu), OUT (build/gpu-serving).
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_DIR:-.gpu}
OUT=${OUT:-build/gpu-serving}
CIV="$GPU_DIR/civetta"
KDIR="$GPU_DIR/kernels/sm_90"
MODEL_ARGS=${BENCH_ARGS:---arch llama --quant q8_0 --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"

echo "== parity (GPU vs CPU, batch vs solo on the GPU)"
"$GPU_DIR/gpu_check" --backend cuda --kernel-dir "$KDIR" 2>&1 | tee "$OUT/parity.md" || echo "PARITY FAILED"

echo "== serving: aggregate tokens/s at concurrency 1..16"
model=/tmp/serving-model.gguf
[[ -f $model ]] || "$CIV" model synth $MODEL_ARGS -o $model >/dev/null
CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$KDIR" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
  CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
  "$CIV" serve -m $model --grpc-addr 127.0.0.1:50081 --metrics-addr 127.0.0.1:9581 > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do grep -q listening "$OUT/serve.log" && break; sleep 1; done
"$CIV" bench --remote 127.0.0.1:50081 --concurrency 1,2,4,8,16 --requests 32 -n 64 -q -o json > "$OUT/serving.json" 2> "$OUT/bench.log" \
  || { echo "BENCH FAILED"; tail -5 "$OUT/bench.log"; }
"$CIV" bench --remote 127.0.0.1:50081 --concurrency 1,2,4,8,16 --requests 32 -n 64 -q -o md 2>/dev/null | tee "$OUT/serving.md" || true
curl -s 127.0.0.1:9581/metrics | grep -E "^civetta_batch_(rows|sequences)_(sum|count)" | tee "$OUT/batch-metrics.txt" || true
kill $pid; wait $pid 2>/dev/null || true
