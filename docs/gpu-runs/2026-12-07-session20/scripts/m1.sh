#!/usr/bin/env bash
# Session 20, call m1 (#14): where a 16-row serving step goes on main 3de3714.
# 1) daemon serving c1 and c16 (32 requests, -n 64), with graph debug logs: eager tapes, captures;
# 2) batch_decode_bench 1,16 --profile on the 1.4B Q8_0 model.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m1; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m1.tgz -C $OUT m1; }
trap finish EXIT
for b in civetta bdb; do [[ -x $W/$b ]] || { xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; }; done
K=$G/kernels
DENSE=$W/dense.gguf
[[ -s $DENSE ]] || $W/civetta model synth --arch llama --quant q8_0 --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192 -o $DENSE > /dev/null
stamp "model ready"
serve_round() { # TAG
  local tag=$1
  env CIVETTA_LOG=info,civetta::backend::gpu=debug CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $W/civetta serve -m $DENSE --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$tag.log && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$tag.log | head -1 | cut -d= -f2)
  maddr=$(grep -o "metrics=[0-9.:]*" $O/serve-$tag.log | head -1 | cut -d= -f2)
  for c in 1 16; do
    local before=$(wc -l < $O/serve-$tag.log)
    timeout 120 $W/civetta bench --remote "$addr" --concurrency $c --requests 32 -n 64 -q -o json > $O/serving-$tag-c$c.json 2> $O/serving-$tag-c$c.err
    local seg=$(tail -n +$((before+1)) $O/serve-$tag.log)
    printf "%s c%-2s %s | eager %s captured %s\n" $tag $c \
      "$(python3 -c "import json,sys;d=json.load(open(sys.argv[1]));t=d['remote'][0];print('%.1f t/s itl p50 %.2f p99 %.2f ms gen %s'%(t['tokens_per_second'],1e3*t['itl_p50_s'],1e3*t['itl_p99_s'],t.get('generated_tokens','?')))" $O/serving-$tag-c$c.json 2>&1|tail -1)" \
      "$(grep -c 'first sighting' <<<"$seg")" "$(grep -c 'graph captured' <<<"$seg")"
  done
  python3 -c "import urllib.request,sys;print(urllib.request.urlopen('http://'+sys.argv[1]+'/metrics').read().decode())" $maddr > $O/metrics-$tag.txt 2>&1
  grep -E "^civetta_batch_(rows|sequences)_(count|sum)" $O/metrics-$tag.txt
  kill $pid; wait $pid 2>/dev/null
}
serve_round r1
serve_round r2
stamp "serving done"
timeout 150 $W/bdb -m $DENSE --backend cuda --kernel-dir $K --batches 1,16 --steps 48 --batched-attention --matvec-mma --profile > $O/bdb.md 2> $O/bdb.err
echo "bdb rc=$?"; cat $O/bdb.md | head -80
stamp done
