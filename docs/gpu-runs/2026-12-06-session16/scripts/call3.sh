#!/usr/bin/env bash
# Session 16, call 3 (fresh): kernels-new (mat-vec weights prefetched into registers before the
# wait; mma mat-vecs wait at entry) vs kernels-l2 (weights prefetched into L2, loops unchanged; mma
# mat-vecs prefetch too), both with overlapped launches, against s15 and plain launches (l2 kernels);
# kernel timing at 5% and 1%; batched decode; then llama.cpp built and run against both. Into $OUT/c3.tgz.
set -uo pipefail
source .gpu/16/common.sh
KL=$S/kernels-l2/sm_90
O=$OUT/c3; mkdir -p $O
finish() { tar czf $OUT/c3.tgz -C $OUT c3; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
( for q in q8_0 q4_k; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-new model synth $SZ --quant $q -o $W/tmp-$q.gguf && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; touch $W/synth.done ) > $O/synth.log 2>&1 &
stamp "gpu_check, l2 kernels"
timeout 120 $W/gpu_check --backend cuda --kernel-dir $KL --archs llama,qwen3 --quants q8_0,q4_k,q6_k > $O/parity-l2.md 2> $O/parity-l2.err; echo "rc=$?"
timeout 60 $W/gpu_check --backend cuda --kernel-dir $KL --archs qwen3moe --quants q8_0 > $O/parity-l2-moe.md 2> $O/parity-l2-moe.err; echo "rc=$?"
grep -E "FAIL|^\| [a-z]|within" $O/parity-l2*.md
timeout 200 bash -c "until [[ -f $W/synth.done ]]; do sleep 2; done"; tail -2 $O/synth.log
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3; local K=$KL bin=$W/civetta-new extra=()
  [[ $b == s15 ]] && { K=$K15; bin=$W/civetta-s15; }
  [[ $b == ovl ]] && K=$KN
  [[ $b == plain ]] && extra=(--gpu-overlap-launches false)
  $bin bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json "${extra[@]}" "$@" > $O/civ-$q-$b-$tag.json 2>> $O/bench.err
}
for r in 1 2; do for q in q8_0 q4_k; do
  order="s15 ovl l2 plain"; (( r == 2 )) && order="plain l2 ovl s15"
  for b in $order; do stamp "round $r $q $b"; civ $b $q r$r --kernel-timing off; done
done; done
stamp "kernel timing"
civ l2 q8_0 on5 --kernel-timing on --sample-rate 0.05
civ l2 q8_0 on1 --kernel-timing on --sample-rate 0.01
civ plain q8_0 on5 --kernel-timing on --sample-rate 0.05
civ s15 q8_0 on5 --kernel-timing on --sample-rate 0.05
civ l2 q8_0 r3 --kernel-timing off
civ l2 q4_k on5 --kernel-timing on --sample-rate 0.05
for b in s15 ovl l2 plain; do
  K=$KL; bin=$W/batch_decode_bench-new; extra=""
  [[ $b == s15 ]] && { K=$K15; bin=$W/batch_decode_bench-s15; }
  [[ $b == ovl ]] && K=$KN
  [[ $b == plain ]] && extra="--no-overlap-launches"
  for q in q8_0 q4_k; do
    timeout 60 $bin --kernel-dir $K -m $W/m-$q.gguf --batches 1,16 --steps 48 --batched-attention --matvec-mma $extra > $O/bd-$q-$b.md 2> $O/bd-$q-$b.err
    echo "bd $q $b"; grep "^| [0-9]" $O/bd-$q-$b.md
  done
done
python3 $S/summarise.py $O | tee $O/summary-ab.md
stamp "llama.cpp build"
JOBS=16 bash $G/llama/build.sh; tail -2 /tmp/llama.cpp/build.log
civ2() { local K=$KL; [[ $2 == ovl ]] && K=$KN
  $W/civetta-new bench -m $W/m-$1.gguf --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 -q -o json --kernel-timing off > $O/civL-$1-$2$3.json 2>> $O/bench.err; }
for q in q8_0 q4_k; do
  stamp "civetta $q (1)"; civ2 $q l2 r1; civ2 $q ovl r1
  stamp "llama-bench $q -fa 0,1"
  /tmp/llama.cpp/build/bin/llama-bench -m $W/m-$q.gguf -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > $O/llama-$q.json 2> $O/llama-$q.err || tail -3 $O/llama-$q.err
  stamp "civetta $q (2)"; civ2 $q ovl r2; civ2 $q l2 r2
done
for b in l2 ovl; do python3 $S/summarise.py $O $b > $O/summary-$b.md; cp $O/summary.json $O/summary-$b.json; done; tail -12 $O/summary-l2.md; tail -9 $O/summary-ovl.md
stamp done
