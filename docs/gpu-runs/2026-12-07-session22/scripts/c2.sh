#!/usr/bin/env bash
# Session 22, call c2 (#14). 0) gpu_check qwen2moe Q8_0 with the device-routing check's new rule. 1) GPU: more rounds of c1's serving A/B (engine.gpu.batched_prefill_attention
#    false = before, true = after; one binary; 1.4B Q8_0; c1 and c16, 32 requests of 64 tokens), 4 rounds.
# 2) CPU on this host's Xeon: the mixed scenario (a 3000-token prompt while 4 streams decode, streams of
#    up to 2048 tokens, --mixed-control) on 2 pinned cores, client on 4-7, SmolLM2-shaped Q4_1 (one round):
#    before = main's planner (civetta), after = the whole step bounded (civetta-new); 2 rounds.
set -uo pipefail
G=$PWD/.gpu/22; W=/tmp/s22; mkdir -p $W; T=${TAG:-c2}; O=$OUT/$T; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/$T.tgz -C $OUT $T; }
trap finish EXIT
for b in civetta civetta-new gpu_check; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $O/cpu.txt
[[ -z ${SKIP_PARITY:-} ]] && stamp "gpu_check qwen2moe q8_0 (the routing check's new rule)" && timeout 60 $W/gpu_check --backend cuda --kernel-dir $K --archs qwen2moe --quants q8_0 > $O/parity-qwen2moe.md 2>&1; echo "rc=$?"
grep -E "device routing|^\| qwen|within tolerance" $O/parity-qwen2moe.md | cut -c1-260
stamp "gpu serving"
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
    print(sys.argv[2], "c%d %.1f t/s ttft p50 %.1f ms itl p50/p95 %.2f/%.2f ms" % (t["concurrency"], t["tokens_per_second"], 1e3 * t["ttft_p50_s"], 1e3 * t["itl_p50_s"], 1e3 * t["itl_p95_s"]))
PY
}
for r in $(seq ${ROUNDS:-4}); do
  if (( r % 2 )); then order="before after"; else order="after before"; fi
  for n in $order; do serve $n r$r --concurrency 1,16 --requests 32 -n 64; done
  finish
done
[[ -n ${SKIP_CPU:-} ]] && exit 0
stamp "cpu mixed"
mkdir -p $O/cpu-mixed
[[ -s $W/smol.gguf ]] || $W/civetta-new model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 \
  --heads 9 --kv-heads 3 --vocab 49152 --tied --context 4096 --seed 1 -o $W/smol.gguf > /dev/null
ln -sf $W/smol.gguf $O/cpu-mixed/smollm2-shaped-q4_1.gguf
OUT=$O/cpu-mixed SERVER_CPUS=0,1 CLIENT_CPUS=4-7 LEVELS=1 REQUESTS=4 MIXED=3000 MIXED_CONTROL=1 \
  timeout 300 bash $G/serving-ab.sh $W/civetta $W/civetta-new ${CPU_ROUNDS:-1} 2>&1 | tail -12
stamp done
