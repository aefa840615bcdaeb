#!/usr/bin/env bash
# Session 12, device call 3: the grouped expert GEMM for MoE prefill (moe_gemm_f16_64x64) beside the
# device routing of call 1/2. Synth of the 24-layer file in the background; gpu_check MoE + dense;
# the MoE bench with device routing + grouped prefill (default) and the host path (--gpu-moe-device-routing false).
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c3; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
xz -dc $G/15/gpu_check.xz > /tmp/g15/gpu_check && chmod +x /tmp/g15/gpu_check
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-24l.gguf
( s=$(date +%s); [[ -s $M ]] || /tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 24 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf > /dev/null && mv /tmp/g15/tmp.gguf $M; echo "synth rc=$? s=$(( $(date +%s) - s ))" ) &
stamp "ptxas grouped gemm"
ptxas -arch=sm_90 -v "$K/gemm_f16.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g" | cut -c1-200
stamp "gpu_check MoE"
timeout 200 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe,qwen2moe --quants q8_0,q4_k 2>&1 | grep -v "^|---" | cut -c1-400
stamp "gpu_check dense"
timeout 90 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3 --quants q8_0,q4_k 2>&1 | grep -E "^\| (llama|qwen3)|gpu_check"
stamp "waiting for synth"
timeout 300 bash -c "until [[ -s $M ]]; do sleep 2; done"; ls -la $M
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
stamp "bench default (device routing, grouped prefill)"
timeout 120 /tmp/g15/civetta "${BA[@]}" > $O/civetta.json 2> $O/civetta.err; echo rc=$?
stamp "bench host path"
timeout 120 /tmp/g15/civetta "${BA[@]}" --gpu-moe-device-routing false > $O/civetta-host.json 2>> $O/civetta.err; echo rc=$?
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
for f in ("civetta.json", "civetta-host.json"):
    try:
        d = json.load(open(os.path.join(o, f)))
        print(f, [(t["name"], round(t["mean_tps"], 1), [round(x, 1) for x in t.get("samples_tps", [])]) for t in d["tests"]], d["hashes"]["overall_sha256"][:16])
    except Exception as e: print(f, "missing", e)
PY
tail -3 $O/civetta.err
stamp "profile 5%"
timeout 100 /tmp/g15/civetta bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 32 -r 1 --prefill-batch 512 -q -o json --kernel-timing on --sample-rate 0.05 > $O/civetta-profile.json 2>> $O/civetta.err; echo rc=$?
stamp done
