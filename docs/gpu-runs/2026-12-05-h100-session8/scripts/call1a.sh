#!/usr/bin/env bash
# Session 8, device call 1a: llama.cpp CUDA build and the bench models' synthesis in the background,
# gpu_check (all synthetic models, MoE with the forced-routing rule) in the foreground.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/1a; mkdir -p $O /tmp/g15 /tmp/s8
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
nproc; free -g | head -2
JOBS=8 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta
setsid bash $G/s8/synth.sh > $O/synth.log 2>&1 < /dev/null &
sp=$!
stamp "gpu_check, all synthetic models (defaults)"
timeout 330 $G/gpu_check --backend cuda --kernel-dir $G/kernels/sm_90 > $O/parity.md 2> $O/parity.err; echo "gpu_check rc=$?"
cat $O/parity.md; tail -5 $O/parity.err
stamp "gpu_check with the staged GEMM kernels (kernels-new): the GEMM users"
timeout 150 $G/gpu_check --backend cuda --kernel-dir $G/kernels-new/sm_90 --archs llama,qwen3,gemma3 --quants f16,q8_0,q5_0,q4_k,q6_k > $O/parity-new.md 2> $O/parity-new.err; echo "gpu_check new rc=$?"
cat $O/parity-new.md; tail -5 $O/parity-new.err
stamp "waiting for synth"
timeout $(( 570 - ($(date +%s) - t0) )) tail --pid=$sp -f /dev/null; cat $O/synth.log; ls -la /tmp/s8 /tmp/g15
tail -2 /tmp/llama.cpp/build.log 2>/dev/null; cat /tmp/llama.cpp/build.rc 2>/dev/null
stamp done
