#!/usr/bin/env bash
# Session 21, call c1 (#14): batched prefill attention (one KV-store and one attention launch per
# layer for a step's prompts). 1) gpu_check, all synthetic models (parity, the 5-sequence batch vs
# solo, and the new bit-equality of batched vs per-sequence attention); 2) serving c1/c8/c16 on the
# 1.4B Q8_0 model, before (main's host code) vs after, interleaved rounds.
set -uo pipefail
G=$PWD/.gpu/21; W=/tmp/s21; mkdir -p $W; O=$OUT/${TAG:-c1}; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/${TAG:-c1}.tgz -C $OUT ${TAG:-c1}; }
trap finish EXIT
for b in civetta civetta-before gpu_check bdb; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null &
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
if [[ -z ${SKIP_PARITY:-} ]]; then
stamp "gpu_check"
timeout 260 $W/gpu_check --backend cuda --kernel-dir $K > $O/parity.md 2> $O/parity.err; echo "gpu_check rc=$?"
grep -E "FAIL|within tolerance" $O/parity.md | head -20; grep -c "^| " $O/parity.md
grep "batched vs per-sequence" $O/parity.md | awk '{print $NF=="", $0}' | grep -v " 0*$" | cut -c1-200 | sort | uniq -c | sort -rn | head -5
grep "batched vs per-sequence" $O/parity.md | grep -vE ": ([0-9]+)/\1 " | head -10
tail -n 3 $O/parity.err
finish
fi
wait
stamp "serving"
serve() { # BUILD MODEL ROUND
  local b=$1 model=$2 r=$3 tag=$2-$1-$3 bin=$W/civetta
  [[ $b == before ]] && bin=$W/civetta-before
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $bin serve -m $W/$model.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$tag.log && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$tag.log | head -1 | cut -d= -f2)
  timeout 120 $W/civetta bench --remote "$addr" ${BENCH:---concurrency 1,8,16 --requests 32 -n 64} -q -o json > $O/serving-$tag.json 2> $O/serving-$tag.err || echo "BENCH FAILED $tag"
  kill $pid; wait $pid 2>/dev/null
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(sys.argv[2], ' '.join('c%d=%.1f'%(t['concurrency'],t['tokens_per_second']) for t in d['remote']))" $O/serving-$tag.json $tag
}
for r in $(seq ${ROUNDS:-2}); do
  if (( r % 2 )); then order="before after"; else order="after before"; fi
  for n in $order; do serve $n ${MODEL:-dense} $r; done
  finish
done
stamp "mixed: a 3000-token prompt while 4 streams decode"
for n in ${MIXED_ORDER:-after before}; do BENCH="--concurrency= --mixed 3000 --mixed-streams 4" serve $n ${MODEL:-dense} mixed$((++mi)); done
for f in $O/serving-*-mixed*.json; do python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
for m in d.get('mixed') or []:
    print(sys.argv[1].split('/')[-1], 'long_ttft %.3f s' % m['long_ttft_s'], 'idle p50/p99 %.2f/%.2f ms' % (1e3*m['idle']['p50_s'], 1e3*m['idle']['p99_s']), 'during p50/p99 %.2f/%.2f ms (n=%d)' % (1e3*m['during']['p50_s'], 1e3*m['during']['p99_s'], m['during']['samples']))" $f; done
finish
stamp done
