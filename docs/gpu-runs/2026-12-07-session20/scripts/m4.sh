#!/usr/bin/env bash
# Session 20, call m4 (#14/#17): matvec_mma pipelined variants (kv/*) x 8- or 16-wave builds for
# launches with fewer tiles than SMs (--no-mma-wide = 8 waves always), 8- and 16-row decode steps.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m4; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m4.tgz -C $OUT m4; }
trap finish EXIT
for b in civetta bdb; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null &
wait
for v in base P P1 P3; do rm -rf $W/k-$v; mkdir -p $W/k-$v; cp $G/kernels/* $W/k-$v/; cp $G/kv/$v/matvec_mma.ptx $W/k-$v/; done
CONFIGS="base:narrow base:wide P:narrow P:wide P1:wide P3:wide"
stamp "ready"
for r in 1 2; do
  for c in $CONFIGS; do
    v=${c%%:*}; mode=${c##*:}; flag=""; [[ $mode == narrow ]] && flag=--no-mma-wide
    for m in dense q4k; do
      timeout 60 $W/bdb -m $W/$m.gguf --backend cuda --kernel-dir $W/k-$v --batches 8,16 --steps 64 --batched-attention --matvec-mma $flag > $O/bdb-$m-$v-$mode-$r.md 2> $O/bdb-$m-$v-$mode-$r.err
      echo "$m $v $mode r$r rc=$? $(grep -E '^\| (8|16) ' $O/bdb-$m-$v-$mode-$r.md | awk -F'|' '{printf "%s:%s ",$2,$3}')"
    done
  done
done
grep -o '"matvec_mma_wide_below":[a-z0-9]*' $O/bdb-dense-P-wide-1.md
stamp done
