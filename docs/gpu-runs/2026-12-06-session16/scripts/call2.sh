#!/usr/bin/env bash
# Session 16, call 2 (warm, right after call1.sh): interleaved A/B on the 1.4B Q8_0 / Q4_K models:
# s15 vs new (overlapped launches) vs plain (plain launches), timing off; 5% kernel timing on the
# new build; llama-bench -fa 0,1 against the new build on the same files. Into $OUT/c2.tgz.
set -uo pipefail
source .gpu/16/common.sh
O=$OUT/c2; mkdir -p $O
finish() { tar czf $OUT/c2.tgz -C $OUT c2; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3; local K=$KN bin=$W/civetta-new extra=()
  [[ $b == s15 ]] && { K=$K15; bin=$W/civetta-s15; }
  [[ $b == plain ]] && extra=(--gpu-overlap-launches false)
  [[ $b == k15 ]] && K=$K15
  $bin bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json "${extra[@]}" "$@" > $O/civ-$q-$b-$tag.json 2>> $O/bench.err
}
for r in 1 2; do for q in q8_0 q4_k; do
  order="s15 ovl plain k15"; (( r == 2 )) && order="k15 plain ovl s15"
  for b in $order; do stamp "round $r $q $b"; civ $b $q r$r --kernel-timing off; done
done; done
stamp "timing 5% q8_0 new, then off once more"; civ ovl q8_0 on5 --kernel-timing on --sample-rate 0.05; civ ovl q8_0 r3 --kernel-timing off
timeout 120 bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"; tail -2 $O/llama-wait.log
civ2() { $W/civetta-new bench -m $W/m-$1.gguf --backend cuda --kernel-dir $KN -p 512,2048 -n 128 -r 3 --prefill-batch 2048 -q -o json --kernel-timing off > $O/civL-$1-$2.json 2>> $O/bench.err; }
for q in q8_0 q4_k; do
  stamp "civetta $q (1)"; civ2 $q r1
  stamp "llama-bench $q -fa 0,1"
  /tmp/llama.cpp/build/bin/llama-bench -m $W/m-$q.gguf -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > $O/llama-$q.json 2> $O/llama-$q.err || tail -3 $O/llama-$q.err
  stamp "civetta $q (2)"; civ2 $q r2
done
python3 $S/summarise.py $O | tee $O/summary.md
stamp done
