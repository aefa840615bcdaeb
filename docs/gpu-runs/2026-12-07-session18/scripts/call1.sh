#!/usr/bin/env bash
# Session 18, call 1 (#17): why a new decode graph per tg128 repetition (DIAG lines of E), and
# whether taking pooled scratch at the lowest free address (E) removes it; timing cost at 5%
# against off for B2 (session 17) and E, 2 interleaved rounds, 5 reps each.
set -uo pipefail
source .gpu/18/common.sh
O=$OUT/c1; mkdir -p $O
finish() { tar czf $OUT/c1.tgz -C $OUT c1; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
stamp synth; synth q8_0; stamp "models ready"
for r in 1 2; do
  stamp "round $r"
  order="B2 E"; (( r == 2 )) && order="E B2"
  for b in $order; do
    civ $b q8_0 off-$r --kernel-timing off
    civ $b q8_0 on5-$r --kernel-timing on --sample-rate 0.05
  done
  (( r == 1 )) && civ D q8_0 off-diag --kernel-timing off
  finish
done
echo "== D (session 17 pool + DIAG) capture/DIAG lines"; grep -E "captured|DIAG" $O/civ-q8_0-D-off-diag.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-700 | head -30
echo "== B2 capture lines (off-1)"; grep -E "captured|DIAG" $O/civ-q8_0-B2-off-1.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-300 | head -20
echo "== E capture/DIAG lines (off-1)"; grep -E "captured|DIAG" $O/civ-q8_0-E-off-1.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-700 | head -30
finish
stamp "gpu_check of E (pooled scratch at the lowest free address)"
timeout 150 $W/gpu_check-E --backend cuda --kernel-dir $K --archs llama --quants q8_0,q4_k > $O/parity-E.md 2> $O/parity-E.err; echo "rc=$?"
grep -E "FAIL|^\| [a-z]" $O/parity-E.md | head -12; tail -n 2 $O/parity-E.err; finish
serve() { # BUILD ROUND: the daemon on the Q8_0 model, a separate client (E) at concurrency 1 and 16
  local b=$1 r=$2 tag=$1-$2
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $W/civetta-$b serve -m $W/m-q8_0.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$tag.log && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$tag.log | head -1 | cut -d= -f2)
  timeout 120 $W/civetta-E bench --remote "$addr" --concurrency 1,16 --requests 32 -n 64 -q -o json > $O/serving-$tag.json 2> $O/serving-$tag.err || echo "BENCH FAILED $tag"
  kill $pid; wait $pid 2>/dev/null
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(sys.argv[2], ' '.join('c%d=%.1f'%(t['concurrency'],t['tokens_per_second']) for t in d['remote']))" $O/serving-$tag.json $tag
}
for r in 1; do
  order="B2 E"; (( r == 2 )) && order="E B2"
  for b in $order; do stamp "serving $b round $r"; serve $b $r; done
  finish
done
stamp done
