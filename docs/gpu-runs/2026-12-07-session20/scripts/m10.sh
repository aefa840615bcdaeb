#!/usr/bin/env bash
# Session 20, call m10 (#17): the one-row Q4_K mat-vecs with fewer units per lane and round: A = main
# (g32 U4, g128 U4), B = g32 U2, C = g128 U3, D = both (one round each, fewer clamped re-reads).
# tg128 on the 1.4B Q4_K model, 3 interleaved rounds; greedy hashes once per variant.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m10; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m10.tgz -C $OUT m10; }
trap finish EXIT
for b in civetta; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/q4k.gguf ]] || $W/civetta model synth $SZ --quant q4_k -o $W/q4k.gguf > /dev/null
for u in A B C D; do rm -rf $W/kd3-$u; mkdir -p $W/kd3-$u; cp $G/kernels/* $W/kd3-$u/; cp $G/kv3/$u/matvec_dp4a.ptx $W/kd3-$u/; done
stamp ready
for u in A B C D; do
  timeout 100 $W/civetta bench -m $W/q4k.gguf --backend cuda --kernel-dir $W/kd3-$u -p 0 -n 16 -r 1 --hash-tokens 16 -q -o json > $O/hash-u$u.json 2> $O/hash-u$u.err
  echo "u$u hash $(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['hashes']['overall_sha256'][:16])" $O/hash-u$u.json 2>&1 | tail -1)"
done
for r in 1 2 3; do
  for u in A B C D; do
    timeout 100 $W/civetta bench -m $W/q4k.gguf --backend cuda --kernel-dir $W/kd3-$u -p 0 -n 128 -r 5 --hash-tokens 0 -q -o json > $O/tg-u$u-$r.json 2> $O/tg-u$u-$r.err
    echo "u$u r$r $(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']))" $O/tg-u$u-$r.json 2>&1 | tail -1)"
  done
done
stamp done
