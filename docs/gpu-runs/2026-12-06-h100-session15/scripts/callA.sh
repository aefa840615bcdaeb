#!/usr/bin/env bash
# Session 15, call A (fresh): llama.cpp CUDA build (FA kernels on) in the background, the 1.4B
# models, and gpu_check on the archs / types the first call did not cover. Into $OUT/a.tgz.
set -uo pipefail
source .gpu/15/common.sh
O=$OUT/a; mkdir -p $O
finish() { tar czf $OUT/a.tgz -C $OUT a; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
JOBS=16 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
( for q in q8_0 q4_k; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-after model synth $SZ --quant $q -o $W/tmp-$q.gguf && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; touch $W/synth.done ) > $O/synth.log 2>&1 &
stamp "gpu_check llama / qwen2 / qwen3 / gemma3 on the other types"
timeout 200 $W/gpu_check --backend cuda --kernel-dir $KA --archs llama,qwen2,qwen3 --quants f32,q5_0,q6_k,q4_0 > $O/parity-more.md 2> $O/parity-more.err; echo "rc=$?"
timeout 100 $W/gpu_check --backend cuda --kernel-dir $KA --archs gemma3 --quants f16,q4_k,q6_k > $O/parity-gemma3.md 2> $O/parity-gemma3.err; echo "rc=$?"
timeout 150 $W/gpu_check --backend cuda --kernel-dir $KA --archs qwen3moe --quants q4_k,q8_0 > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
cat $O/parity-*.md | grep -E "FAIL|^\| [a-z]|within" | head -60; tail -n 2 $O/parity-*.err
timeout $(( 570 - ($(date +%s) - t0) )) bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"; tail -2 $O/llama-wait.log
stamp done
