#!/usr/bin/env bash
# Session 12, device call 1: llama.cpp build + the 24-layer Qwen3-30B-A3B-shaped Q4_K synth in the
# background; gpu_check of qwen3moe/qwen2moe (device routing vs CPU, vs host routing) and a dense
# regression; then the MoE bench: device routing, host routing, 5% profile; llama-bench if built.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c1; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)" >> $O/gpu.txt
JOBS=10 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
xz -dc $G/15/gpu_check.xz > /tmp/g15/gpu_check && chmod +x /tmp/g15/gpu_check
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-24l.gguf
( s=$(date +%s); [[ -s $M ]] || /tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 24 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf && mv /tmp/g15/tmp.gguf $M; echo "synth rc=$? s=$(( $(date +%s) - s ))" > $O/synth.txt ) &
stamp "ptxas moe kernels"
for f in moe moe_matvec; do ptxas -arch=sm_90 -v "$K/$f.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g"; done > $O/ptxas-moe.txt; cat $O/ptxas-moe.txt | cut -c1-220
stamp "gpu_check MoE"
timeout 200 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe,qwen2moe --quants q8_0,q4_k > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
cat $O/parity-moe.md; tail -3 $O/parity-moe.err
stamp "gpu_check dense regression"
timeout 90 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3 --quants q8_0,q4_k > $O/parity-dense.md 2> $O/parity-dense.err; echo "rc=$?"
grep -E "^\| (llama|qwen3)|gpu_check" $O/parity-dense.md; tail -2 $O/parity-dense.err
stamp "waiting for synth"
timeout 200 bash -c "until [[ -s $M ]]; do sleep 2; done"; cat $O/synth.txt
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
stamp "bench device routing"
timeout 120 /tmp/g15/civetta "${BA[@]}" > $O/civetta.json 2> $O/civetta.err; echo rc=$?
stamp "bench host routing"
timeout 120 /tmp/g15/civetta "${BA[@]}" --gpu-moe-device-routing false > $O/civetta-host.json 2>> $O/civetta.err; echo rc=$?
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
for f in ("civetta.json", "civetta-host.json"):
    try:
        d = json.load(open(os.path.join(o, f)))
        print(f, [(t["name"], round(t["mean_tps"], 1), t.get("samples_tps")) for t in d["tests"]], d.get("hash", d.get("token_hash")))
    except Exception as e: print(f, "missing", e)
PY
tail -3 $O/civetta.err
stamp "profile 5% device routing"
timeout 100 /tmp/g15/civetta bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 64 -r 1 --prefill-batch 512 -q -o json --kernel-timing on --sample-rate 0.05 > $O/civetta-profile.json 2>> $O/civetta.err; echo rc=$?
stamp "llama build state"; tail -2 /tmp/llama.cpp/build.log 2>/dev/null; cat /tmp/llama.cpp/build.rc 2>/dev/null
stamp done
