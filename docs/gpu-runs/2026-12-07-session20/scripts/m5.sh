#!/usr/bin/env bash
# Session 20, call m5 (#14): the pipelined matrix-unit mat-vecs with 16-wave builds for launches
# with fewer tiles than SMs ("after": kernels/ of this tree, engine.gpu.matvec_mma_wide on) against
# main's ("before": the 8-wave build as session 11 wrote it (kv/base), matvec_mma_wide off).
# 1) serving c1/c8/c16 (32 requests, -n 64), rounds before, after, after, before x2;
# 2) batch_decode_bench 1,4,8,16 --profile (after); 3) matvec_bench rows 4,16: rel. L2 vs CPU.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m5; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m5.tgz -C $OUT m5; }
trap finish EXIT
for b in civetta bdb mvb; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null &
wait
rm -rf $W/k-before $W/k-after; mkdir -p $W/k-before $W/k-after
cp $G/kernels/* $W/k-after/; cp $G/kernels/* $W/k-before/; cp $G/kv/base/matvec_mma.ptx $W/k-before/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt; cat $O/gpu.txt
stamp ready
serve() { # NAME MODEL ROUND
  local name=$1 model=$2 r=$3 tag wide=true
  tag=$model-$name-$r; [[ $name == before ]] && wide=false
  env CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$W/k-$name CIVETTA_ENGINE__GPU__MATVEC_MMA_WIDE=$wide \
    CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $W/civetta serve -m $W/$model.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-$tag.log 2>&1 &
  local pid=$! addr
  for _ in $(seq 120); do grep -q listening $O/serve-$tag.log && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-$tag.log | head -1 | cut -d= -f2)
  timeout 120 $W/civetta bench --remote "$addr" --concurrency 1,8,16 --requests 32 -n 64 -q -o json > $O/serving-$tag.json 2> $O/serving-$tag.err
  echo "$tag $(python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(' '.join('c%d=%.1f'%(t['concurrency'],t['tokens_per_second']) for t in d['remote']))" $O/serving-$tag.json 2>&1 | tail -1)"
  kill $pid; wait $pid 2>/dev/null
}
for m in ${MODELS:-dense q4k}; do
  for r in 1 2 3 4; do
    if (( r % 2 )); then order="before after"; else order="after before"; fi
    for n in $order; do serve $n $m $r; done
  done
done
stamp "serving done"
python3 - $O <<'PY' | tee $O/summary.md
import json, sys, glob, statistics as st
O = sys.argv[1]
for m in ("dense", "q4k"):
    for n in ("before", "after"):
        lv = {}
        for f in sorted(glob.glob(f"{O}/serving-{m}-{n}-*.json")):
            try: d = json.load(open(f))
            except Exception: continue
            for t in d["remote"]: lv.setdefault(t["concurrency"], []).append(t["tokens_per_second"])
        if 1 in lv and 16 in lv:
            print(f"{m} {n}: c1 {st.median(lv[1]):.1f} c8 {st.median(lv[8]):.1f} c16 {st.median(lv[16]):.1f} (rounds {' / '.join('%.0f'%x for x in lv[16])}) c16/c1 {st.median(lv[16])/st.median(lv[1]):.2f}x c8/c1 {st.median(lv[8])/st.median(lv[1]):.2f}x")
PY
timeout 120 $W/bdb -m $W/dense.gguf --backend cuda --kernel-dir $W/k-after --batches 1,4,8,16 --steps 64 --batched-attention --matvec-mma --profile > $O/bdb-profile-dense.md 2>&1
grep -E "^\| [0-9]|profile, |matvec_mma" $O/bdb-profile-dense.md
for m in dense q4k; do timeout 90 $W/mvb -m $W/$m.gguf --backend cuda --kernel-dir $W/k-after --rows 4,16 --variants mma --matvec-max-rows 16 > $O/mvb-$m.md 2>&1; done
grep -hE "^\| blk|^\| output" $O/mvb-*.md | awk -F'|' '{printf "%s %s r%s %s %s us  relL2 %s\n",$2,$3,$5,$7,$8,$12}'
stamp done
