#!/usr/bin/env bash
# Session 18, call 1b (#17; call 1 cut to what the remaining device budget allows): one round of
# B2 / E at timing off and 5%, graph captures counted; D's DIAG lines (what differs in the new
# tape of each request on session 17's pool).
set -uo pipefail
source .gpu/18/common.sh
O=$OUT/c1b; mkdir -p $O
finish() { tar czf $OUT/c1b.tgz -C $OUT c1b; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
stamp synth; synth q8_0; stamp "models ready"
civ D q8_0 off-diag --kernel-timing off
civ E q8_0 off-1 --kernel-timing off
finish
civ E q8_0 on5-1 --kernel-timing on --sample-rate 0.05
civ B2 q8_0 on5-1 --kernel-timing on --sample-rate 0.05
civ B2 q8_0 off-1 --kernel-timing off
finish
echo "== D (session 17 pool + DIAG) capture/DIAG lines"; grep -E "captured|DIAG" $O/civ-q8_0-D-off-diag.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-600 | head -24
echo "== E capture/DIAG lines (off-1)"; grep -E "captured|DIAG" $O/civ-q8_0-E-off-1.err | sed -E 's/^[0-9T:.-]+Z +DEBUG civetta::backend::gpu: //' | cut -c1-600 | head -16
finish
civ E q8_0 off-2 --kernel-timing off
civ E q8_0 on5-2 --kernel-timing on --sample-rate 0.05
civ B2 q8_0 off-2 --kernel-timing off
civ B2 q8_0 on5-2 --kernel-timing on --sample-rate 0.05
stamp done
