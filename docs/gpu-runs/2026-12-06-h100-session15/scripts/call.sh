#!/usr/bin/env bash
# Session 15, one device call (budget left after failed starts: no llama.cpp build this time).
# 1. gpu_check parity of this change (rope_qk, decode attention storing k/v and writing the o
#    projection's q8_1 input, rmsnorm_q8_1 on 1024 threads, one event per op in timed graphs);
# 2. interleaved A/B of civetta before (cd9344b + its kernels) and after on the 1.4B Q8_0 / Q4_K
#    models of scripts/gpu-check.sh, timing off; 3. 5% kernel timing vs off; 4. batched decode.
# Everything into $OUT/s15.tgz.
set -uo pipefail
source .gpu/15/common.sh
O=$OUT/s15; mkdir -p $O
finish() { tar czf $OUT/s15.tgz -C $OUT s15; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> $O/gpu.txt; cat $O/gpu.txt
( for q in q8_0 q4_k; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-after model synth $SZ --quant $q -o $W/tmp-$q.gguf && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; touch $W/synth.done ) > $O/synth.log 2>&1 &
stamp "gpu_check llama, qwen3 (head 128), gemma3 (head 256)"
timeout 150 $W/gpu_check --backend cuda --kernel-dir $KA --archs llama,qwen3 --quants f16,q8_0,q4_k > $O/parity-dense.md 2> $O/parity-dense.err; echo "rc=$?"
timeout 60 $W/gpu_check --backend cuda --kernel-dir $KA --archs gemma3 --quants q8_0 > $O/parity-gemma3.md 2> $O/parity-gemma3.err; echo "rc=$?"
stamp "gpu_check gpt-oss (sinks)"
timeout 90 $W/gpu_check --backend cuda --kernel-dir $KA --archs gpt-oss --quants mxfp4 > $O/parity-gptoss.md 2> $O/parity-gptoss.err; echo "rc=$?"
cat $O/parity-*.md | grep -E "FAIL|^\| " | head -60; tail -n 3 $O/parity-*.err
stamp "waiting for the models"
timeout 150 bash -c "until [[ -f $W/synth.done ]]; do sleep 2; done"; cat $O/synth.log
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3; local K=$KA; [[ $b == before ]] && K=$KB
  $W/civetta-$b bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json "$@" > $O/civ-$q-$b-$tag.json 2>> $O/bench.err
}
for r in 1 2; do for q in q8_0 q4_k; do
  order="before after"; (( r == 2 )) && order="after before"
  for b in $order; do stamp "round $r $q $b"; civ $b $q r$r --kernel-timing off; done
done; done
for b in after before; do stamp "timing 5% q8_0 $b"; civ $b q8_0 on5 --kernel-timing on --sample-rate 0.05; done
stamp "after, timing off once more"; civ after q8_0 r3 --kernel-timing off
for b in before after; do K=$KA; [[ $b == before ]] && K=$KB
  stamp "batch_decode_bench q8_0 $b"
  timeout 60 $W/batch_decode_bench-$b --kernel-dir $K -m $W/m-q8_0.gguf --batches 1,16 --steps 48 --batched-attention --matvec-mma > $O/bd-q8_0-$b.md 2> $O/bd-q8_0-$b.err
  grep "^| [0-9]" $O/bd-q8_0-$b.md
done
python3 $S/summarise.py $O | tee $O/summary.md
stamp done
