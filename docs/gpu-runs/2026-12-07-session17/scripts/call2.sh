#!/usr/bin/env bash
# Session 17, call 2 (#17): kernel timing's cost on tg128, with the graph captures, timed
# captures and timing resolutions counted from the debug log (B2 = B + the logs; bench now
# installs the log subscriber). Rates 5%, 1%, 0.2% against off, 2 interleaved rounds, 5 reps.
set -uo pipefail
source .gpu/17/common.sh
O=$OUT/c2; mkdir -p $O
finish() { tar czf $OUT/c2.tgz -C $OUT c2; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
stamp synth; synth q8_0; stamp "models ready"
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3
  CIVETTA_LOG=civetta::backend::gpu=debug timeout 90 $W/civetta-$b bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 5 --prefill-batch 2048 -q -o json "$@" > $O/civ-$q-$b-$tag.json 2> $O/civ-$q-$b-$tag.err
  local e=$O/civ-$q-$b-$tag.err
  printf "%-6s %-8s %s | eager %s captures %s timed-captures %s resolves %s\n" $b $tag \
    "$(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']))" $O/civ-$q-$b-$tag.json 2>&1 | tail -1)" \
    "$(grep -c 'run eagerly' $e)" "$(grep -c 'GPU graph captured' $e)" "$(grep -c 'timed graph captured' $e)" "$(grep -c 'timings resolved' $e)"
}
for r in 1 2; do
  stamp "round $r"
  for t in off on5 on1 on02; do
    case $t in off) a=(--kernel-timing off);; on5) a=(--kernel-timing on --sample-rate 0.05);; on1) a=(--kernel-timing on --sample-rate 0.01);; on02) a=(--kernel-timing on --sample-rate 0.002);; esac
    civ B2 q8_0 $t-$r "${a[@]}"
  done
done
for t in off on5; do
  case $t in off) a=(--kernel-timing off);; on5) a=(--kernel-timing on --sample-rate 0.05);; esac
  civ s16 q8_0 $t "${a[@]}"
done
stamp done
