#!/usr/bin/env bash
# Session 20, call m3 (#14/#17): matvec_mma variants (kv/*: compile-time unroll / pipelining) vs the
# shipped kernels, 16-row decode steps of the 1.4B Q8_0 and Q4_K models, interleaved rounds.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m3; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m3.tgz -C $OUT m3; }
trap finish EXIT
for b in civetta bdb mvb; do [[ -x $W/$b ]] || { xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; }; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null &
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null &
wait
VARS="base ${VARS:-E F G H I}"
for v in $VARS; do
  mkdir -p $W/k-$v; cp $G/kernels/* $W/k-$v/
  [[ $v == base ]] || cp $G/kv/$v/matvec_mma.ptx $W/k-$v/
done
stamp "ready: $VARS"
for r in 1 2; do
  for v in $VARS; do
    for m in dense q4k; do
      timeout 60 $W/bdb -m $W/$m.gguf --backend cuda --kernel-dir $W/k-$v --batches 8,16 --steps 48 --batched-attention --matvec-mma > $O/bdb-$m-$v-$r.md 2> $O/bdb-$m-$v-$r.err
      echo "$m $v r$r rc=$? $(grep -E '^\| (8|16) ' $O/bdb-$m-$v-$r.md)"
    done
  done
done
stamp done
