#!/usr/bin/env bash
# Session 8, device call 2a: llama.cpp build + model synthesis in the background; gpu_check of the
# MoE models (routing rule for prefill and batch-vs-solo) and of dense models on the new prefill
# attention / staged GEMMs; prefill attention A/B (auto = matrix-step kernel vs scalar); batched
# decode with the mat-vecs vs the 64x64 staged GEMM. Everything goes into $OUT/2a.tgz.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/2a; K=$G/kernels/sm_90; mkdir -p $O /tmp/g15 /tmp/s8
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/2a.tgz -C $OUT 2a; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
JOBS=14 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
# An 80 GB card cannot hold the 48-layer file with its experts' f16 copies: 24 layers there.
export MOE_LAYERS=48; (( mem < 100000 )) && MOE_LAYERS=24
setsid bash $G/s8/synth.sh > $O/synth.log 2>&1 < /dev/null &
stamp "gpu_check MoE (qwen3moe, qwen2moe; every type)"
timeout 320 $G/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe,qwen2moe > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
grep -E "^\| q|FAIL|tolerance" $O/parity-moe.md; tail -3 $O/parity-moe.err
stamp "gpu_check dense subset (head sizes 64 and 128 on the matrix-step prefill attention)"
timeout 130 $G/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3 --quants f32,f16,q8_0,q4_k,q6_k > $O/parity-dense.md 2> $O/parity-dense.err; echo "rc=$?"
cat $O/parity-dense.md; tail -3 $O/parity-dense.err
timeout 60 bash -c 'until [[ -s /tmp/s8/m-q4_k.gguf ]]; do sleep 2; done'
for q in q8_0 q4_k; do for att in auto scalar auto scalar; do
  stamp "prefill attention A/B: $q $att"
  $G/civetta bench -m /tmp/s8/m-$q.gguf --backend cuda --kernel-dir $K -p 512,2048 -n 0 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json \
    --kernel-timing off --gpu-prefill-attention $att > $O/att-$q-$att-$(date +%s).json 2>> $O/bench.err
done; done
python3 - $O <<'PY'
import json, sys, os, glob
for p in sorted(glob.glob(os.path.join(sys.argv[1], "att-*.json"))):
    try: d = json.load(open(p))
    except Exception: print(os.path.basename(p), "unreadable"); continue
    print(os.path.basename(p), [(t["name"], round(t["mean_tps"], 1)) for t in d["tests"]], (d.get("hashes") or {}).get("overall_sha256", "")[:16])
PY
for mr in 32 4; do
  stamp "batch_decode_bench q8_0, matvec_max_rows $mr"
  timeout 80 $G/batch_decode_bench --kernel-dir $K -m /tmp/s8/m-q8_0.gguf --batches 1,8,16,32 --steps 32 --batched-attention --matvec-max-rows $mr > $O/bd-q8_0-mr$mr.md 2> $O/bd-q8_0-mr$mr.err
  grep "^| [0-9]" $O/bd-q8_0-mr$mr.md
done
tail -2 /tmp/llama.cpp/build.log 2>/dev/null; cat $O/synth.log
stamp done
