#!/usr/bin/env bash
# Session 22, call c1. 1) gpu_check of qwen2moe Q8_0/Q5_0/Q4_K (session 21's one failure: device vs
#    host routing 5.10e-2; this build also prints each path's distance to the CPU at the worst step)
#    and gpt-oss MXFP4/Q8_0/Q4_K (the batched attention path with sinks and windowed layers, never
#    run on a GPU). 2) #14's serving A/B in one binary: "before" = engine.gpu.batched_prefill_attention
#    false (per-sequence prefill attention), "after" = true (the default); 1.4B Q8_0 model,
#    `civetta bench --remote --concurrency 1,16 --requests 32 -n 64`, rounds BA AB BA AB; then the
#    mixed scenario (a 3000-token prompt while 4 streams decode) once each.
set -uo pipefail
G=$PWD/.gpu/22; W=/tmp/s22; mkdir -p $W; T=${TAG:-c1}; O=$OUT/$T; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/$T.tgz -C $OUT $T; }
trap finish EXIT
for b in civetta gpu_check; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
if [[ -z ${SKIP_PARITY:-} ]]; then
  stamp "gpu_check qwen2moe"
  timeout 150 $W/gpu_check --backend cuda --kernel-dir $K --archs qwen2moe --quants q8_0,q5_0,q4_k > $O/parity-qwen2moe.md 2> $O/parity-qwen2moe.err; echo "rc=$?"
  grep -E "device routing|FAIL|within tolerance" $O/parity-qwen2moe.md | cut -c1-260
  stamp "gpu_check gpt-oss"
  timeout 150 $W/gpu_check --backend cuda --kernel-dir $K --archs gpt-oss --quants mxfp4,q8_0,q4_k > $O/parity-gptoss.md 2> $O/parity-gptoss.err; echo "rc=$?"
  grep -E "^\| gpt|batched vs per|device routing|FAIL|within tolerance" $O/parity-gptoss.md | cut -c1-260
  tail -n 2 $O/parity-*.err
  finish
fi
wait
stamp "serving"
serve() { # BUILD TAG BENCH...
  local b=$1 tag=$2 on=true; shift 2
  [[ $b == before ]] && on=false
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false CIVETTA_ENGINE__GPU__BATCHED_PREFILL_ATTENTION=$on \
    $W/civetta serve -m $W/dense.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$b-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$b-$tag.log && break; sleep 0.5; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$b-$tag.log | head -1 | cut -d= -f2)
  timeout 100 $W/civetta bench --remote "$addr" "$@" -q -o json > $O/serving-$b-$tag.json 2> $O/serving-$b-$tag.err || { echo "BENCH FAILED $b $tag"; tail -3 $O/serve-$b-$tag.log; }
  kill $pid; wait $pid 2>/dev/null
  python3 - $O/serving-$b-$tag.json $b-$tag <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["remote"]:
    print(sys.argv[2], "c%d %.1f t/s ttft p50 %.1f ms itl p50 %.2f ms" % (t["concurrency"], t["tokens_per_second"], 1e3 * t["ttft_p50_s"], 1e3 * t["itl_p50_s"]))
for m in d.get("mixed") or []:
    print(sys.argv[2], "mixed long_ttft %.3f s idle p50/p99 %.2f/%.2f ms during p50/p99 %.2f/%.2f ms (n=%d)" % (m["long_ttft_s"], 1e3 * m["idle"]["p50_s"], 1e3 * m["idle"]["p99_s"], 1e3 * m["during"]["p50_s"], 1e3 * m["during"]["p99_s"], m["during"]["samples"]))
PY
}
for r in $(seq ${ROUNDS:-4}); do
  if (( r % 2 )); then order="before after"; else order="after before"; fi
  for n in $order; do serve $n r$r --concurrency 1,16 --requests 32 -n 64; done
  finish
done
stamp "mixed"
for n in after before; do serve $n mixed --concurrency= --mixed 3000 --mixed-streams 4; done
stamp done
