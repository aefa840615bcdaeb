#!/usr/bin/env bash
# Session 18, call 2 (#17): F = main 894ad20 (pooled buffers at the lowest free address, KV caches in
# size classes) against B2 (session 17's behaviour): tg128 at timing off and 5%, graph captures
# counted, greedy hashes of the 4 hash prompts (16 tokens) compared.
set -uo pipefail
source .gpu/18/common.sh
O=$OUT/c2; mkdir -p $O
finish() { tar czf $OUT/c2.tgz -C $OUT c2; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
stamp synth; synth q8_0; stamp "models ready"
civ F q8_0 off-1 --kernel-timing off --hash-tokens 16
civ B2 q8_0 off-1 --kernel-timing off --hash-tokens 16
finish
civ F q8_0 on5-1 --kernel-timing on --sample-rate 0.05
civ B2 q8_0 on5-1 --kernel-timing on --sample-rate 0.05
finish
for b in F B2; do python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(sys.argv[2], (d.get('hashes') or {}).get('overall_sha256'))" $O/civ-q8_0-$b-off-1.json $b; done
civ F q8_0 off-2 --kernel-timing off
civ B2 q8_0 off-2 --kernel-timing off
stamp done
