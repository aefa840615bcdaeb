#!/usr/bin/env bash
# Serving A/B on the CUDA backend (issue #14's GPU target: aggregate tokens/s at concurrency 16
# >= 8x concurrency 1; docs/GPU.md "Serving: the host side of a batched step"). Two civetta
# builds serve the same synthetic models in turn (rounds before, after, after, before) and a
# separate client (`civetta bench --remote`) measures concurrency 1, 8 and 16.
# Models: the 1.4B dense Q8_0 of scripts/gpu-check.sh (vocabulary 32000) and an 8-layer
# Qwen3-30B-A3B-shaped MoE Q4_K with Qwen3's 151936-token vocabulary, where the logits of a
# 16-row step are 9.7 MB.
#
# usage (build machine):  scripts/gpu-serving-ab.sh prepare BEFORE_BIN  -> $GPU_DIR (default .gpu/14):
#                         stripped, xz'd cuda builds (civetta after = this tree, before =
#                         BEFORE_BIN, batch_decode_bench), sm_90 PTX, this script as run.sh
#        (GPU machine):   bash .gpu/14/run.sh        env: OUT (summary.md and serving-14.tgz of
#                         every report and log), ROUNDS (4), MODELS ("dense moe"; also "gptoss":
#                         an 8-layer gpt-oss-20b-shaped MXFP4 model, vocab 201,088)
set -uo pipefail

if [[ "${1:-}" == prepare ]]; then
  set -e
  cd "$(dirname "$0")/.."
  GPU_DIR=${GPU_DIR:-.gpu/14}
  before=${2:?usage: scripts/gpu-serving-ab.sh prepare BEFORE_BIN}
  cargo build --release --features cuda --bin civetta --example batch_decode_bench
  make kernels-ptx CLANG="${CLANG:-clang-22}" CUDA_ARCH=sm_90
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/kernels"
  cp -r "$(ls -d build/kernels/clang-*/sm_90 | sort -V | tail -1)" "$GPU_DIR/kernels/sm_90"
  strip -o "$GPU_DIR/civetta-after" target/release/civetta
  strip -o "$GPU_DIR/civetta-before" "$before"
  strip -o "$GPU_DIR/batch_decode_bench" target/release/examples/batch_decode_bench
  xz -9 -f "$GPU_DIR"/civetta-after "$GPU_DIR"/civetta-before "$GPU_DIR"/batch_decode_bench
  cp scripts/gpu-serving-ab.sh "$GPU_DIR/run.sh"
  du -sh "$GPU_DIR"
  exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
# Results are written to a work folder and returned as one archive in $OUT (the device tool
# returns a limited number of files).
OUT=${OUT:-/tmp/gpu-serving-out}
O=/tmp/g14-results
rm -rf $O
ROUNDS=${ROUNDS:-4}
W=/tmp/g14
mkdir -p "$O" $W
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }
for b in civetta-after civetta-before batch_decode_bench; do
  [[ -x $W/$b ]] || { xz -dc "$D/$b.xz" > $W/$b && chmod +x $W/$b; }
done
K="$D/kernels/sm_90"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$O/gpu.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> "$O/gpu.txt"
cat "$O/gpu.txt"

# Models (files left by an earlier call on the same warm machine are reused).
MODELS=${MODELS:-dense moe}
has() { [[ " $MODELS " == *" $1 "* ]]; }
DENSE=$W/dense-1.4b-q8_0.gguf
MOE=$W/q3moe-8l-q4_k.gguf
GPTOSS=$W/gptoss-8l-mxfp4.gguf
stamp "synthesising the models: $MODELS"
# gpt-oss: synth ties dim to heads x 64 (45 / 9 heads for gpt-oss-20b's 2880).
has gptoss && { [[ -s $GPTOSS ]] || $W/civetta-after model synth --arch gpt-oss --quant mxfp4 --size 1b --layers 8 --dim 2880 \
  --heads 45 --kv-heads 9 --experts 32 --experts-used 4 --expert-ffn 2880 --vocab 201088 --context 4096 -o $GPTOSS \
  > "$O/synth-gptoss.txt" 2>&1 & }
has dense && { [[ -s $DENSE ]] || $W/civetta-after model synth --arch llama --quant q8_0 --size 1b --layers 28 --dim 1536 --ffn 8960 \
  --heads 12 --kv-heads 2 --context 8192 -o $DENSE > "$O/synth-dense.txt" 2>&1 & }
has moe && { [[ -s $MOE ]] || $W/civetta-after model synth --arch qwen3moe --quant q4_k --size 1b --layers 8 --dim 2048 --heads 32 \
  --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 \
  -o $MOE > "$O/synth-moe.txt" 2>&1 & }
wait
paths=()
has dense && paths+=("$DENSE")
has moe && paths+=("$MOE")
has gptoss && paths+=("$GPTOSS")
ls -la "${paths[@]}"

serve() { # NAME BIN MODEL ROUND
  local name=$1 bin=$2 model=$3 round=$4 tag
  tag=$(basename "$model" .gguf)-$name-$round
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    "$bin" serve -m "$model" --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > "$O/serve-$tag.log" 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening "$O/serve-$tag.log" && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" "$O/serve-$tag.log" | head -1 | cut -d= -f2)
  # The client is the "after" build in every run (same measuring code for both servers).
  timeout 120 $W/civetta-after bench --remote "$addr" --concurrency 1,8,16 --requests 32 -n 64 -q -o json \
    > "$O/serving-$tag.json" 2> "$O/serving-$tag.err" || { echo "BENCH FAILED $tag"; tail -3 "$O/serving-$tag.err"; }
  kill $pid; wait $pid 2>/dev/null
}

for model in "${paths[@]}"; do
  for r in $(seq "$ROUNDS"); do
    if (( r % 2 )); then order=(before after); else order=(after before); fi
    for name in "${order[@]}"; do
      stamp "serving $(basename $model) $name round $r"
      serve $name $W/civetta-$name $model $r
    done
  done
done

stamp "batch_decode_bench (after build, the server's defaults)"
for model in "${paths[@]}"; do
  timeout 120 $W/batch_decode_bench -m $model --backend cuda --kernel-dir "$K" --batches 1,16 --steps 48 \
    --batched-attention --matvec-mma --profile > "$O/batch-$(basename $model .gguf).md" 2> "$O/batch-$(basename $model .gguf).err"
  echo "rc=$? $(basename $model)"; grep -E "^\| [0-9]|profile, " "$O/batch-$(basename $model .gguf).md"
done

python3 - "$O" "$ROUNDS" <<'PY' | tee "$O/summary.md"
import json, sys, statistics as st
out, rounds = sys.argv[1], int(sys.argv[2])
import glob
for model in ("dense-1.4b-q8_0", "q3moe-8l-q4_k", "gptoss-8l-mxfp4"):
    if not glob.glob(f"{out}/serving-{model}-*.json"):
        continue
    print(f"\n{model}: medians of {rounds} rounds (aggregate t/s; x = of c1; ITL p50 / p99 ms; TTFT p99 ms)")
    print("| build | c1 t/s | c8 t/s | c16 t/s | c16 / c1 | c16 ITL p50 / p99 | c16 TTFT p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("before", "after"):
        lv = {}
        for r in range(1, rounds + 1):
            try:
                rep = json.load(open(f"{out}/serving-{model}-{name}-{r}.json"))
            except Exception as e:
                print(f"  missing {name} round {r}: {e}"); continue
            for t in rep["remote"]:
                lv.setdefault(t["concurrency"], []).append(t)
        if 1 not in lv or 16 not in lv:
            continue
        m = lambda c, k: st.median(t[k] for t in lv[c])
        runs = " / ".join(f"{t['tokens_per_second']:.0f}" for t in lv[16])
        print(f"| {name} | {m(1,'tokens_per_second'):.1f} | {m(8,'tokens_per_second'):.1f} | {m(16,'tokens_per_second'):.1f} ({runs}) "
              f"| {m(16,'tokens_per_second')/m(1,'tokens_per_second'):.2f}x | {1e3*m(16,'itl_p50_s'):.2f} / {1e3*m(16,'itl_p99_s'):.2f} | {1e3*m(16,'ttft_p99_s'):.0f} |")
PY
mkdir -p "$OUT" && cp "$O/summary.md" "$OUT/" && tar czf "$OUT/serving-14.tgz" -C "$O" . && stamp "done: $OUT/serving-14.tgz"
