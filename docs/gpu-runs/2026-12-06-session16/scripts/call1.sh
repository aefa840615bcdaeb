#!/usr/bin/env bash
# Session 16, call 1 (fresh): llama.cpp CUDA build (FA kernels on) in the background, the 1.4B
# models, and gpu_check of overlapped launches (graphs with programmatic dependent launch vs eager
# plain launches, bit for bit; GPU vs CPU within tolerance). Into $OUT/c1.tgz.
set -uo pipefail
source .gpu/16/common.sh
O=$OUT/c1; mkdir -p $O
finish() { tar czf $OUT/c1.tgz -C $OUT c1; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> $O/gpu.txt; cat $O/gpu.txt
JOBS=12 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
( for q in q8_0 q4_k; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-new model synth $SZ --quant $q -o $W/tmp-$q.gguf && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; touch $W/synth.done ) > $O/synth.log 2>&1 &
stamp "gpu_check llama, qwen3, qwen2 (dense)"
timeout 200 $W/gpu_check --backend cuda --kernel-dir $KN --archs llama,qwen3,qwen2 --quants f16,q8_0,q4_k,q5_0,q6_k > $O/parity-dense.md 2> $O/parity-dense.err; echo "rc=$?"
stamp "gpu_check gemma3, gpt-oss, qwen3moe"
timeout 60 $W/gpu_check --backend cuda --kernel-dir $KN --archs gemma3 --quants q8_0,q4_k > $O/parity-gemma3.md 2> $O/parity-gemma3.err; echo "rc=$?"
timeout 90 $W/gpu_check --backend cuda --kernel-dir $KN --archs gpt-oss --quants mxfp4 > $O/parity-gptoss.md 2> $O/parity-gptoss.err; echo "rc=$?"
timeout 120 $W/gpu_check --backend cuda --kernel-dir $KN --archs qwen3moe --quants q4_k > $O/parity-moe.md 2> $O/parity-moe.err; echo "rc=$?"
cat $O/parity-*.md | grep -E "FAIL|^\| [a-z]|within|raw Q4" | head -60; tail -n 2 $O/parity-*.err
stamp "waiting for the models"
timeout 200 bash -c "until [[ -f $W/synth.done ]]; do sleep 2; done"; cat $O/synth.log | tail -3
stamp "batch_decode_bench q8_0: s15, ovl (overlapped launches), plain"
for b in s15 ovl plain; do
  K=$KN; bin=$W/batch_decode_bench-new; extra=""
  [[ $b == s15 ]] && { K=$K15; bin=$W/batch_decode_bench-s15; }
  [[ $b == plain ]] && extra="--no-overlap-launches"
  timeout 60 $bin --kernel-dir $K -m $W/m-q8_0.gguf --batches 1,16 --steps 48 --batched-attention --matvec-mma $extra > $O/bd-q8_0-$b.md 2> $O/bd-q8_0-$b.err
  echo "$b"; grep "^| [0-9]" $O/bd-q8_0-$b.md
done
stamp done
