#!/usr/bin/env bash
# Session 20, call m6 (#14): the committed kernels with the 16-wave builds for every launch
# (CIVETTA_EXP_WIDE_BELOW=100000, an uncommitted experiment build of batch_decode_bench) against
# the committed choice (only launches with fewer tiles than SMs), 8- and 16-row steps, 3 rounds.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m6; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m6.tgz -C $OUT m6; }
trap finish EXIT
for b in civetta bdb-exp; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null &
wait
stamp ready
for r in 1 2 3; do
  for mode in narrow all; do
    for m in dense q4k; do
      if [[ $mode == all ]]; then export CIVETTA_EXP_WIDE_BELOW=100000; else unset CIVETTA_EXP_WIDE_BELOW; fi
      timeout 60 $W/bdb-exp -m $W/$m.gguf --backend cuda --kernel-dir $G/kernels --batches 8,16 --steps 64 --batched-attention --matvec-mma > $O/bdb-$m-$mode-$r.md 2> $O/bdb-$m-$mode-$r.err
      echo "$m $mode r$r rc=$? $(grep -E '^\| (8|16) ' $O/bdb-$m-$mode-$r.md | awk -F'|' '{printf "%s:%s ",$2,$3}') $(grep -o '"matvec_mma_wide_below":[0-9a-z]*' $O/bdb-$m-$mode-$r.md)"
    done
  done
done
unset CIVETTA_EXP_WIDE_BELOW
stamp done
