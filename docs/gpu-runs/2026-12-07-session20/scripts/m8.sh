#!/usr/bin/env bash
# Session 20, call m8 (#14): EXPERIMENT, 32-row tiles for the 8-wave Q8_0 mat-vecs (gate/up, output):
# CIVETTA_EXP_T32=t32 (2 blocks a round, 185 registers) / t32u1 (1 block, 107) vs the committed kernel.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m8; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m8.tgz -C $OUT m8; }
trap finish EXIT
for b in civetta bdb-exp mvb-exp; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
stamp ready
for r in 1 2 3; do
  for mode in base t32 t32u1; do
    if [[ $mode == base ]]; then unset CIVETTA_EXP_T32; else export CIVETTA_EXP_T32=$mode; fi
    timeout 60 $W/bdb-exp -m $W/dense.gguf --backend cuda --kernel-dir $G/kernels-t32 --batches 8,16 --steps 64 --batched-attention --matvec-mma > $O/bdb-$mode-$r.md 2> $O/bdb-$mode-$r.err
    echo "$mode r$r rc=$? $(grep -E '^\| (8|16) ' $O/bdb-$mode-$r.md | awk -F'|' '{printf "%s:%s  vs alone %s ",$2,$3,$6}')"
  done
done
for mode in t32 t32u1; do
  CIVETTA_EXP_T32=$mode timeout 60 $W/mvb-exp -m $W/dense.gguf --backend cuda --kernel-dir $G/kernels-t32 --rows 5,16 --variants mma --matvec-max-rows 16 > $O/mvb-$mode.md 2>&1
  echo "== $mode"; grep -hE "^\| blk|^\| output" $O/mvb-$mode.md | awk -F'|' '{printf "%s r%s %s %s us relL2 %s\n",$2,$5,$7,$8,$12}'
done
unset CIVETTA_EXP_T32
stamp done
