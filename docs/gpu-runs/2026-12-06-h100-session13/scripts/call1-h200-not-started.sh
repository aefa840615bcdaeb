#!/usr/bin/env bash
# Session 13, device call 1 (H200): llama.cpp CUDA build and the 48-layer Qwen3-30B-A3B-shaped Q4_K
# synth in the background; MoE parity (gpu_check) on the H200 meanwhile. Call 2 benches.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c1; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $O/gpu.txt
JOBS=12 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
xz -dc $G/15/gpu_check.xz > /tmp/g15/gpu_check && chmod +x /tmp/g15/gpu_check
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-48l.gguf
setsid bash -c "s=\$(date +%s); /tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 48 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf > /tmp/g15/synth.log 2>&1 && mv /tmp/g15/tmp.gguf $M; echo \"synth rc=\$? s=\$(( \$(date +%s) - s ))\" >> /tmp/g15/synth.log" > /dev/null 2>&1 < /dev/null &
stamp "gpu_check MoE (H200)"
timeout 240 /tmp/g15/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe,qwen2moe --quants q8_0,q4_k > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
cat $O/parity-moe.md | cut -c1-250; tail -3 $O/parity-moe.err
stamp "waiting for synth (up to 300 s more)"
timeout 300 bash -c "until [[ -s $M ]]; do sleep 3; done"; cat /tmp/g15/synth.log | tail -2; ls -la $M
stamp "llama build state"; tail -2 /tmp/llama.cpp/build.log 2>/dev/null; cat /tmp/llama.cpp/build.rc 2>/dev/null
stamp done
