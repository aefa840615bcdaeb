#!/usr/bin/env bash
# Session 17, call 1 (#17):
#  1. where kernel timing's fixed per-step cost comes from: s16 / A / B, timing off / 5% / 1%,
#     1.4B Q8_0 and Q4_K, graph captures counted from the debug log;
#  2. gpu_check of B (KV caches reused across sequences);
#  3. Q4_K mat-vecs in 64-value units (kernels-wide) against the committed ones: matvec_bench,
#     tg128, gpu_check.
set -uo pipefail
source .gpu/17/common.sh
O=$OUT/c1; mkdir -p $O
finish() { tar czf $OUT/c1.tgz -C $OUT c1; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> $O/gpu.txt; cat $O/gpu.txt
stamp synth; synth q8_0 q4_k; stamp "models ready"
civ() { # BUILD MODEL TAG [extra bench args]; KD overrides the kernel dir
  local b=$1 q=$2 tag=$3; shift 3
  CIVETTA_LOG=civetta::backend::gpu=debug timeout 60 $W/civetta-$b bench -m $W/m-$q.gguf --backend cuda --kernel-dir ${KD:-$K} -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json "$@" > $O/civ-$q-$b-$tag.json 2> $O/civ-$q-$b-$tag.err
  printf "%-6s %-5s %-8s %s captures %s timed %s\n" $b $q $tag \
    "$(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']), (d.get('hashes') or {}).get('overall_sha256','')[:12])" $O/civ-$q-$b-$tag.json 2>&1 | tail -1)" \
    "$(grep -c 'GPU graph captured' $O/civ-$q-$b-$tag.err)" "$(grep -c 'timed graph captured' $O/civ-$q-$b-$tag.err)"
}
for r in 1 2; do
  order="s16 A B"; (( r == 2 )) && order="B s16"
  for b in $order; do
    stamp "round $r $b"
    civ $b q8_0 off$r --kernel-timing off
    civ $b q8_0 on5-$r --kernel-timing on --sample-rate 0.05
  done
done
for b in s16 B; do civ $b q8_0 on1 --kernel-timing on --sample-rate 0.01; done
for b in s16 B; do civ $b q4_k off --kernel-timing off; civ $b q4_k on5 --kernel-timing on --sample-rate 0.05; done
stamp "timing done"; finish
stamp "gpu_check of B (KV caches reused across sequences)"
timeout 150 $W/gpu_check-B --backend cuda --kernel-dir $K --archs llama --quants q8_0,q4_k > $O/parity-B.md 2> $O/parity-B.err; echo "rc=$?"
grep -E "FAIL|^\| [a-z]" $O/parity-B.md | head -12; tail -n 2 $O/parity-B.err; finish
stamp "matvec_bench q4_k: committed vs wide"
for kd in kernels kernels-wide; do
  timeout 60 $W/matvec_bench -m $W/m-q4_k.gguf --backend cuda --kernel-dir $S/$kd --rows 1,4 --iters 200 > $O/mvb-q4_k-$kd.md 2> $O/mvb-q4_k-$kd.err
  echo "$kd"; grep "^|" $O/mvb-q4_k-$kd.md | head -14
done; finish
stamp "tg128 q4_k: B with committed vs wide kernels"
for r in 1 2; do for kd in kernels kernels-wide; do KD=$S/$kd civ B q4_k $kd-$r --kernel-timing off; done; done; finish
stamp "gpu_check q4_k, wide kernels"
timeout 120 $W/gpu_check-B --backend cuda --kernel-dir $S/kernels-wide --archs llama,qwen3 --quants q4_k > $O/parity-wide.md 2> $O/parity-wide.err; echo "rc=$?"
grep -E "FAIL|^\| [a-z]" $O/parity-wide.md | head -8; tail -n 2 $O/parity-wide.err
stamp done
