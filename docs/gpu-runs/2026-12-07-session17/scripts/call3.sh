#!/usr/bin/env bash
# Session 17, call 3 (diagnostic build D, not committed): which arguments make a new 254-op decode
# tape per tg128 repetition (DIAG lines: a new tape against each cached one of the same length).
set -uo pipefail
source .gpu/17/common.sh
O=$OUT/c3; mkdir -p $O
finish() { tar czf $OUT/c3.tgz -C $OUT c3; }
trap finish EXIT
stamp synth; synth q8_0; stamp "models ready"
CIVETTA_LOG=civetta::backend::gpu=debug timeout 90 $W/civetta-D bench -m $W/m-q8_0.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 5 --prefill-batch 2048 -q -o json --kernel-timing off > $O/civ-D.json 2> $O/civ-D.err
grep -E "captured|eagerly|DIAG" $O/civ-D.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-600 | head -40
stamp done
