#!/usr/bin/env bash
# Session 20, call m9 (#17): the one-row Q8_0 g128 mat-vec (the down projection, K = 8960: 560
# units over 128 lanes) with U = 4 (shipped: two rounds), 5, 6, 8 units a round (one round).
# tg128 on the 1.4B Q8_0 model, 3 interleaved rounds; greedy hashes once per variant.
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m9; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m9.tgz -C $OUT m9; }
trap finish EXIT
for b in civetta; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
for u in 4 5 6 8; do rm -rf $W/kd-u$u; mkdir -p $W/kd-u$u; cp $G/kernels/* $W/kd-u$u/; cp $G/kv2/u$u/matvec_dp4a.ptx $W/kd-u$u/; done
stamp ready
for u in 4 5 6 8; do
  timeout 100 $W/civetta bench -m $W/dense.gguf --backend cuda --kernel-dir $W/kd-u$u -p 0 -n 16 -r 1 --hash-tokens 16 -q -o json > $O/hash-u$u.json 2> $O/hash-u$u.err
  echo "u$u hash $(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['hashes']['overall_sha256'][:16])" $O/hash-u$u.json 2>&1 | tail -1)"
done
for r in 1 2 3; do
  for u in 4 5 6 8; do
    timeout 100 $W/civetta bench -m $W/dense.gguf --backend cuda --kernel-dir $W/kd-u$u -p 0 -n 128 -r 5 --hash-tokens 0 -q -o json > $O/tg-u$u-$r.json 2> $O/tg-u$u-$r.err
    echo "u$u r$r $(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']))" $O/tg-u$u-$r.json 2>&1 | tail -1)"
  done
done
stamp done
