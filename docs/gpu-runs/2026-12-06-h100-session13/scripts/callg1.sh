#!/usr/bin/env bash
# Session 13, device call: gpt-oss on the CUDA backend (MXFP4 experts as int8 planes, YaRN RoPE,
# attention sinks, swiglu_oai) against the CPU backend; regressions of the changed rope/attention
# kernels on dense, Gemma 3 (sliding window, head_dim 256) and qwen3moe models.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/g1; mkdir -p $O /tmp/g13
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $O/gpu.txt
xz -dc $G/13/gpu_check.xz > /tmp/g13/gpu_check && chmod +x /tmp/g13/gpu_check
K=$G/13/kernels/sm_90
for f in rope attention gpt_oss; do ptxas -arch=sm_90 -v "$K/$f.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g"; done > $O/ptxas.txt
grep -c "0 bytes spill stores" $O/ptxas.txt; grep -v "0 bytes spill stores, 0 bytes spill loads" $O/ptxas.txt | cut -c1-200 | head -5
stamp "gpu_check gpt-oss"
timeout 240 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs gpt-oss --quants mxfp4,q8_0,q4_k > $O/parity-gptoss.md 2> $O/parity-gptoss.err; echo "rc=$?"
cut -c1-300 $O/parity-gptoss.md; tail -5 $O/parity-gptoss.err
stamp "gpu_check regressions"
timeout 200 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3,gemma3 --quants q8_0,q4_k > $O/parity-dense.md 2> $O/parity-dense.err; echo "rc=$?"
grep -E "^\| |gpu_check" $O/parity-dense.md | cut -c1-250; tail -3 $O/parity-dense.err
timeout 120 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs qwen3moe --quants q4_k > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
grep -E "^\| |gpu_check" $O/parity-moe.md | cut -c1-250; tail -3 $O/parity-moe.err
stamp done
