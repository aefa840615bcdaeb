#!/usr/bin/env bash
# Session 23, call c2 (#17/#14): a GEMM's converted input (int8 blocks or f16) serves the next GEMM
# on the same buffer (q/k/v, gate/up): 4 quantize launches per layer in a prefill step instead of 7.
# base = c1's binary (new step defaults), new = the same + the shared GEMM input. One machine.
# 1) gpu_check (new, then base) on dense archs: the printed errors must be identical (same bits).
# 2) civetta bench pp512/pp2048 (+ tg32 and greedy hashes), Q8_0 and Q4_K 1.4B, 2 interleaved rounds.
# 3) serving c1/c16 and the mixed scenario, base vs new, SERVE_ROUNDS (1) rounds.
set -uo pipefail
G=$PWD/.gpu/23; W=/tmp/s23; mkdir -p $W; T=${TAG:-c2}; O=$OUT/$T; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/$T.tgz -C $OUT $T; }
trap finish EXIT
for b in civetta civetta-gemm gpu_check gpu_check-base; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
cp $W/civetta $W/civetta-base
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
[[ -s $W/dense-q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/dense-q4k.gguf > /dev/null
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
for b in gpu_check gpu_check-base; do
  stamp "$b"
  timeout ${PARITY_TIMEOUT:-170} $W/$b --backend cuda --kernel-dir $K --archs ${PARITY_ARCHS:-llama,qwen2,gemma3} --quants ${PARITY_QUANTS:-q8_0,q4_k,f16,q6_k,q5_0} > $O/parity-$b.md 2> $O/parity-$b.err; echo "rc=$?"
done
python3 - $O/parity-gpu_check.md $O/parity-gpu_check-base.md <<'PY'
import sys
a, b = [open(f).read().splitlines() for f in sys.argv[1:]]
ra = [l for l in a if l.startswith("|")]; rb = [l for l in b if l.startswith("|")]
print("table lines new/base:", len(ra), len(rb), "identical:", ra == rb)
for x, y in zip(ra, rb):
    if x != y: print("DIFF new :", x[:220]); print("DIFF base:", y[:220])
print("\n".join(l[:200] for l in a if "FAIL" in l or "within tolerance" in l.lower())[:2000])
PY
finish
for r in $(seq ${PP_ROUNDS:-2}); do
  if (( r % 2 )); then order="base gemm"; else order="gemm base"; fi
  for b in $order; do
    bin=$W/civetta-$b; [[ $b == base ]] && bin=$W/civetta-base
    for m in dense dense-q4k; do
      stamp "pp $b $m r$r"
      timeout 120 $bin bench --backend cuda --kernel-dir $K -m $W/$m.gguf -p 512,2048 -n 32 -r 3 --prefill-batch 2048 --kernel-timing off --hash-tokens 32 -q -o json > $O/pp-$b-$m-r$r.json 2> $O/pp-$b-$m-r$r.err || echo "BENCH FAILED"
      python3 -c "
import json,sys; d=json.load(open('$O/pp-$b-$m-r$r.json'))
print('$b $m r$r', ' '.join('%s %.0f' % (t['name'], t['mean_tps']) for t in d['tests']), 'hashes', [c['sha256'][:12] for c in d['hashes']['completions']])"
    done
  done
  finish
done
serve() { # BUILD TAG BENCH...
  local b=$1 tag=$2; shift 2
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false CIVETTA_LOG=info,civetta::engine::scheduler=trace \
    $W/civetta-$b serve -m $W/dense.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$b-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$b-$tag.log && break; sleep 0.5; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$b-$tag.log | head -1 | cut -d= -f2)
  timeout 100 $W/civetta-$b bench --remote "$addr" "$@" -q -o json > $O/$b-$tag.json 2> $O/$b-$tag.err || echo "BENCH FAILED $b $tag"
  kill $pid; wait $pid 2>/dev/null
  python3 - $O/$b-$tag.json $b-$tag <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); name = sys.argv[2]
for t in d.get("remote") or []:
    print(name, "c%d %.1f t/s ttft p50 %.1f ms itl p50/p99 %.2f/%.2f ms" % (t["concurrency"], t["tokens_per_second"], 1e3 * t["ttft_p50_s"], 1e3 * t["itl_p50_s"], 1e3 * t["itl_p99_s"]))
for m in d.get("mixed") or []:
    print(name, "long_ttft %.3f s idle p99 %.2f ms during p50/p99 %.2f/%.2f ms (n=%d)" % (m["long_ttft_s"], 1e3 * m["idle"]["p99_s"], 1e3 * m["during"]["p50_s"], 1e3 * m["during"]["p99_s"], m["during"]["samples"]))
PY
  gzip -f $O/serve-$b-$tag.log
}
for r in $(seq ${SERVE_ROUNDS:-1}); do
  if (( r % 2 )); then order="base gemm"; else order="gemm base"; fi
  stamp "serving round $r"
  for b in $order; do serve $b serving-r$r --concurrency 1,16 --requests 32 -n 64; serve $b mixed-r$r --concurrency= --mixed 3000 --mixed-streams 4 --mixed-stream-tokens 1024; done
  finish
done
stamp done
