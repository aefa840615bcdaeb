#!/usr/bin/env bash
# Session 16, call 5: the final kernels (kernels-final: Q8_0-plane mat-vecs load their first round
# into registers before the wait, Q4_K ones prefetch it into L2; the matrix-unit mat-vecs launch
# plainly, as in s15) against s15 and against themselves with plain launches; batched decode;
# gpu_check; then llama.cpp built and run against them if the call has time. Into $OUT/c5.tgz.
set -uo pipefail
source .gpu/16/common.sh
KF=$S/kernels-final2/sm_90
O=$OUT/c5; mkdir -p $O
finish() { tar czf $OUT/c5.tgz -C $OUT c5; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
( for q in q8_0 q4_k; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-new model synth $SZ --quant $q -o $W/tmp-$q.gguf && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; touch $W/synth.done ) > $O/synth.log 2>&1 &
stamp "gpu_check, final kernels"
timeout 150 $W/gpu_check --backend cuda --kernel-dir $KF --archs llama,qwen3 --quants q4_k,q8_0 > $O/parity-final.md 2> $O/parity-final.err; echo "rc=$?"
grep -E "FAIL|^\| [a-z]|within" $O/parity-final.md
timeout 200 bash -c "until [[ -f $W/synth.done ]]; do sleep 2; done"; tail -2 $O/synth.log
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3; local K=$KF bin=$W/civetta-new extra=()
  [[ $b == s15 ]] && { K=$K15; bin=$W/civetta-s15; }
  [[ $b == plain ]] && extra=(--gpu-overlap-launches false)
  $bin bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json "${extra[@]}" "$@" > $O/civ-$q-$b-$tag.json 2>> $O/bench.err
}
for r in 1 2; do for q in q4_k q8_0; do
  order="s15 final plain"; (( r == 2 )) && order="plain final s15"
  for b in $order; do stamp "round $r $q $b"; civ $b $q r$r --kernel-timing off; done
done; done
for b in s15 final plain s15 final; do
  K=$KF; bin=$W/batch_decode_bench-new; extra=""
  [[ $b == s15 ]] && { K=$K15; bin=$W/batch_decode_bench-s15; }
  [[ $b == plain ]] && extra="--no-overlap-launches"
  for q in q8_0 q4_k; do
    timeout 60 $bin --kernel-dir $K -m $W/m-$q.gguf --batches 1,16 --steps 96 --batched-attention --matvec-mma $extra >> $O/bd-$q-$b.md 2>> $O/bd-$q-$b.err
    echo "bd $q $b"; grep "^| [0-9]" $O/bd-$q-$b.md | tail -2
  done
done
python3 $S/summarise.py $O | head -12 | tee $O/summary-ab.md
stamp done
