#!/usr/bin/env bash
# Batched-decode mat-vecs on the matrix units (engine.gpu.matvec_mma, kernels/matvec_mma.hip;
# issues #14 and #17) on an NVIDIA machine: one device call, under 8 minutes on an H100.
# Written in session 11 without a device: it has NOT run yet.
#   1. ptxas resources of matvec_mma and matvec_dp4a (sm_90);
#   2. parity: gpu_check --gpu-matvec-mma on llama, qwen3 (q/k norms), gemma3 (head 256) in Q8_0 and
#      Q4_K (its batch-vs-solo check decodes 3 sequences: the matrix-unit kernels);
#   3. matvec_bench on the 1.4B Q8_0 and Q4_K shapes, rows 1,2,4,8,16: dp4a vs mma (kernel time,
#      GB/s, rel. L2 vs the CPU);
#   4. batch_decode_bench 1,8,16 sequences, mma off / on, 1.4B Q8_0 and Q4_K (batch vs alone
#      printed there; GPU tolerance 5e-2 relative L2, docs/GPU.md), a per-kernel profile with
#      mma on (Q8_0);
#   5. serving (civetta serve + civetta bench --remote) at concurrency 1,8,16, mma on vs off, if
#      time is left (LIMIT_S).
# Needs the folder of `scripts/gpu-mma-check.sh prepare` (build machine): civetta, gpu_check,
# matvec_bench, batch_decode_bench built with --features cuda, kernels/sm_90/*.ptx.
# usage: scripts/gpu-mma-check.sh prepare   (build machine)
#        scripts/gpu-mma-check.sh           (GPU machine)
# env: GPU_DIR (.gpu), OUT (build/gpu-mma), LIMIT_S (450: later steps are skipped past it).
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_DIR:-.gpu}
O=${OUT:-build/gpu-mma}
LIMIT_S=${LIMIT_S:-450}

if [[ "${1:-}" == prepare ]]; then
  set -e
  cargo build --release --features cuda --bin civetta --example gpu_check --example matvec_bench --example batch_decode_bench
  make kernels-ptx CLANG="${CLANG:-clang-22}" CUDA_ARCH=sm_90
  rm -rf "$GPU_DIR/kernels" && mkdir -p "$GPU_DIR/kernels"
  ptx_dir=$(ls -d build/kernels/clang-*/sm_90 | sort -V | tail -1)
  cp -r "$ptx_dir" "$GPU_DIR/kernels/sm_90"
  for b in civetta examples/gpu_check examples/matvec_bench examples/batch_decode_bench; do strip -o "$GPU_DIR/$(basename $b)" "target/release/$b"; done
  du -sh "$GPU_DIR"
  exit 0
fi

B=$GPU_DIR
K=$GPU_DIR/kernels/sm_90
mkdir -p "$O" /tmp/gpu-mma
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( LIMIT_S - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1
cat "$O/gpu.txt"
echo "kernels: $(head -1 "$K/compiler.txt")"

stamp "ptxas (sm_90): matvec_mma, matvec_dp4a"
for f in matvec_mma matvec_dp4a; do ptxas -arch=sm_90 -v $K/$f.ptx -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
  | sed -E "s/ptxas info *: //g" > "$O/ptxas.txt" 2>&1
grep -E "mma|_x16" "$O/ptxas.txt" | cut -c1-200

M8=/tmp/gpu-mma/m-q8_0.gguf; M4=/tmp/gpu-mma/m-q4_k.gguf
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
stamp "synth 1.4B Q8_0 + Q4_K (background); parity: gpu_check --gpu-matvec-mma"
( [[ -f $M8 ]] || $B/civetta model synth $SZ --quant q8_0 -o $M8 > "$O/synth.log" 2>&1
  [[ -f $M4 ]] || $B/civetta model synth $SZ --quant q4_k -o $M4 >> "$O/synth.log" 2>&1 ) & sp=$!
timeout 120 $B/gpu_check --backend cuda --kernel-dir $K --gpu-matvec-mma --archs llama,qwen3,gemma3 --quants q8_0,q4_k \
  > "$O/parity-mma.md" 2> "$O/parity-mma.err"; echo "parity (mma on) rc=$?"
grep -E "^\| [a-z]" "$O/parity-mma.md" | cut -c1-220
grep -E "error|panick" "$O/parity-mma.err" | head -5
wait $sp

for m in q8_0 q4_k; do
  stamp "matvec_bench $m rows 1,2,4,8,16: dp4a vs mma"
  timeout 90 $B/matvec_bench -m /tmp/gpu-mma/m-$m.gguf --kernel-dir $K --rows 1,2,4,8,16 --iters 100 --variants dp4a,mma \
    > "$O/matvec-$m.md" 2> "$O/matvec-$m.err"; echo "matvec_bench rc=$?"
  head -1 "$O/matvec-$m.md"
  grep -E "^\| blk|^\| output|^\| token" "$O/matvec-$m.md" | awk -F'|' '{printf "%-22s %-5s %4s %-5s %-36s %9s us %6s GB/s  rel %s\n", $2, $3, $5, $6, $7, $8, $9, $12}'
  tail -2 "$O/matvec-$m.err"
done

BD=($B/batch_decode_bench --kernel-dir $K --batches 1,8,16 --steps 48 --batched-attention)
for m in q8_0 q4_k; do
  for mma in off on; do
    [[ $(left) -gt 40 ]] || { echo "no time left for batch_decode_bench $m $mma"; continue; }
    flags=(); [[ $mma == on ]] && flags=(--matvec-mma)
    [[ $mma == on && $m == q8_0 ]] && flags+=(--profile)
    stamp "batch_decode_bench $m mma $mma"
    timeout 100 "${BD[@]}" -m /tmp/gpu-mma/m-$m.gguf "${flags[@]}" > "$O/batch-$m-mma-$mma.md" 2> "$O/batch-$m-mma-$mma.err"
    echo "rc=$?"; grep "^| [0-9]" "$O/batch-$m-mma-$mma.md"; tail -2 "$O/batch-$m-mma-$mma.err"
  done
done
grep -E "profile, (8|16) seq|^  - " "$O/batch-q8_0-mma-on.md" | grep -E "profile|matvec|quantize" | head -20

serve() { # $1 name, rest: environment
  local name=$1; shift
  env "$@" CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $B/civetta serve -m $M8 --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > "$O/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 90); do grep -q listening "$O/serve-$name.log" && break; sleep 1; done
  local addr
  addr=$(grep -o "grpc=[0-9.:]*" "$O/serve-$name.log" | head -1 | cut -d= -f2)
  timeout 90 $B/civetta bench --remote "$addr" --concurrency 1,8,16 --requests 32 -n 64 -q -o json > "$O/serving-$name.json" 2> "$O/serving-$name.err" \
    || { echo "BENCH FAILED"; tail -3 "$O/serving-$name.err"; }
  kill $pid; wait $pid 2>/dev/null
}
for name in on off; do
  [[ $(left) -gt 75 ]] || { echo "no time left for serving (mma $name)"; continue; }
  stamp "serving q8_0 concurrency 1,8,16: mma $name"
  serve $name CIVETTA_ENGINE__GPU__MATVEC_MMA=$([[ $name == on ]] && echo true || echo false)
  python3 - "$O/serving-$name.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1])); lv = r.get("remote", []); base = lv[0]["tokens_per_second"] if lv else None
for x in lv:
    print(f"  c{x['concurrency']}: {x['tokens_per_second']:.1f} t/s ({x['tokens_per_second'] / base:.2f}x of c1), ITL p50 {x['itl_p50_s'] * 1e3:.2f} ms, errors {x['errors']}")
PY
done
stamp "done"
