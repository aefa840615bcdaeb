#!/usr/bin/env bash
# Session 23, call c1 (#14): the GPU mixed scenario (a 3000-token prompt arriving while 4 streams
# decode, 1.4B Q8_0), session 22's defaults against the new per-backend ones, one binary:
#   old    = prefill_batch 64, max_decode_slowdown 3 (set explicitly: session 22's defaults)
#   new    = unset (GPU defaults: prefill_batch 512, slowdown off)
#   sd3    = prefill_batch 512, slowdown 3 (which of the two changes matters)
#   pb2048 = prefill_batch 2048, slowdown off (the largest chunk)
# Rounds interleave; the step trace is logged. Then c1/c16 serving, old against new (no regression).
set -uo pipefail
G=$PWD/.gpu/23; W=/tmp/s23; mkdir -p $W; T=${TAG:-c1}; O=$OUT/$T; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/$T.tgz -C $OUT $T; }
trap finish EXIT
for b in civetta; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
cfg_env() {
  case $1 in
    old) echo CIVETTA_ENGINE__PREFILL_BATCH=64 CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=3 ;;
    new) echo ;;
    sd3) echo CIVETTA_ENGINE__PREFILL_BATCH=512 CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=3 ;;
    pb2048) echo CIVETTA_ENGINE__PREFILL_BATCH=2048 ;;
    bpa0) echo CIVETTA_ENGINE__GPU__BATCHED_PREFILL_ATTENTION=false ;;
    bpa1) echo CIVETTA_ENGINE__GPU__BATCHED_PREFILL_ATTENTION=true ;;
  esac
}
serve() { # CFG TAG BENCH...
  local c=$1 tag=$2; shift 2
  # shellcheck disable=SC2046
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false $(cfg_env $c) \
    CIVETTA_LOG=info,civetta::engine::scheduler=trace \
    $W/civetta serve -m $W/dense.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$c-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$c-$tag.log && break; sleep 0.5; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$c-$tag.log | head -1 | cut -d= -f2)
  timeout 100 $W/civetta bench --remote "$addr" "$@" -q -o json > $O/$c-$tag.json 2> $O/$c-$tag.err || { echo "BENCH FAILED $c $tag"; tail -3 $O/serve-$c-$tag.log; }
  kill $pid; wait $pid 2>/dev/null
  grep -m1 "engine step limits" $O/serve-$c-$tag.log | sed 's/.*engine step limits/limits/' | cut -c1-200
  python3 - $O/$c-$tag.json $O/serve-$c-$tag.log $c-$tag <<'PY'
import json, sys, re
d = json.load(open(sys.argv[1])); name = sys.argv[3]
for t in d.get("remote") or []:
    print(name, "c%d %.1f t/s ttft p50/p99 %.1f/%.1f ms itl p50/p99 %.2f/%.2f ms" % (t["concurrency"], t["tokens_per_second"], 1e3 * t["ttft_p50_s"], 1e3 * t["ttft_p99_s"], 1e3 * t["itl_p50_s"], 1e3 * t["itl_p99_s"]))
for m in d.get("mixed") or []:
    print(name, "long_ttft %.3f s idle p50/p99 %.2f/%.2f ms during p50/p99/max? %.2f/%.2f ms (n=%d) outlasted %s" % (m["long_ttft_s"], 1e3 * m["idle"]["p50_s"], 1e3 * m["idle"]["p99_s"], 1e3 * m["during"]["p50_s"], 1e3 * m["during"]["p99_s"], m["during"]["samples"], m["streams_outlasted_prefill"]))
    steps = [l for l in open(sys.argv[2]) if "scheduler: step" in l]
    mixed = [l for l in steps if "Prefill" in l and "Decode" in l]
    print("  ", len(steps), "steps,", len(mixed), "mixed")
    for l in mixed[:3] + mixed[len(mixed) // 2:len(mixed) // 2 + 2] + mixed[-2:]:
        print("  ", re.sub(r" states=.*", "", l.split("scheduler: ")[1]).strip()[:200])
PY
  gzip -f $O/serve-$c-$tag.log
}
MIX="--concurrency= --mixed 3000 --mixed-streams 4 --mixed-stream-tokens 1024"
for r in 1 2 3; do
  if (( r % 2 )); then order="old new sd3 pb2048"; else order="pb2048 sd3 new old"; fi
  stamp "mixed round $r"
  for c in $order; do serve $c mixed-r$r $MIX; done
  finish
done
for r in 1 2; do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  stamp "serving round $r"
  for c in $order; do serve $c serving-r$r --concurrency 1,16 --requests 32 -n 64; done
  finish
done
# On an H200 (#14 names one): session 22's A/B of the batched prefill attention, 4 rounds.
if grep -q H200 $O/gpu.txt; then
  for r in 1 2 3 4; do
    if (( r % 2 )); then order="bpa0 bpa1"; else order="bpa1 bpa0"; fi
    stamp "H200 batched prefill attention A/B round $r"
    for c in $order; do serve $c serving-r$r --concurrency 1,16 --requests 32 -n 64; done
    finish
  done
fi
stamp done
