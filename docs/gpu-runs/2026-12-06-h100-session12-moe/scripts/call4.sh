#!/usr/bin/env bash
# Session 12, device call 4: the down mat-vec with the weighted sum folded in (moe_matvec_sum_*).
# gpu_check MoE; then the 24-layer bench A/B on one machine, interleaved: call 3's binary (prev:
# separate down + moe_weighted_sum) vs this one; the greedy hashes must match (bit-identical fold).
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c4; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
xz -dc $G/s12/civetta-prev.xz > /tmp/g15/civetta-prev && chmod +x /tmp/g15/civetta-prev
xz -dc $G/15/gpu_check.xz > /tmp/g15/gpu_check && chmod +x /tmp/g15/gpu_check
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-24l.gguf
( s=$(date +%s); [[ -s $M ]] || /tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 24 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf > /dev/null && mv /tmp/g15/tmp.gguf $M; echo "synth rc=$? s=$(( $(date +%s) - s ))" ) &
ptxas -arch=sm_90 -v "$K/moe_matvec.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g" | grep sum | cut -c1-200
stamp "gpu_check MoE"
timeout 200 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe,qwen2moe --quants q8_0,q4_k 2>&1 | grep -v "^|---" | grep -E "^\||device routing|gpu_check" | cut -c1-300
stamp "waiting for synth"
timeout 300 bash -c "until [[ -s $M ]]; do sleep 2; done"; ls -la $M
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
for i in 1 2; do for b in prev new; do
  bin=/tmp/g15/civetta; [[ $b == prev ]] && bin=/tmp/g15/civetta-prev
  stamp "bench $b $i"
  timeout 100 $bin "${BA[@]}" > $O/civetta-$b-$i.json 2>> $O/civetta.err; echo rc=$?
done; done
python3 - $O <<'PY'
import json, sys, os, glob
o = sys.argv[1]
for f in sorted(glob.glob(os.path.join(o, "civetta-*.json"))):
    try:
        d = json.load(open(f))
        print(os.path.basename(f), [(t["name"], round(t["mean_tps"], 1), [round(x, 1) for x in t.get("samples_tps", [])]) for t in d["tests"]], d["hashes"]["overall_sha256"][:16])
    except Exception as e: print(f, "missing", e)
PY
tail -3 $O/civetta.err
stamp done
