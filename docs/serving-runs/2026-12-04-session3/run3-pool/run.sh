#!/usr/bin/env bash
# #18: spinning pool (after = main 2a40d08, the pool merged) vs rayon (before = main 4d7e357, the same
# tree without the pool) on the idle Xeon host, interleaved rounds A B / B A, plus pool_overhead and
# 2-thread serving with the pool. .gpu/19/civetta was the no-pool binary in this run.
set -uo pipefail
R=$OUT/18; mkdir -p $R; W=/tmp/r18; mkdir -p $W
cp .gpu/19/civetta $W/before; cp .gpu/18/civetta-after $W/after; cp .gpu/18/pool_overhead $W/po; chmod +x $W/*
lscpu | grep -E "Model name|^CPU\(s\)|Thread" > $R/cpu.txt
S=$W/smol-q4_1.gguf; K=$W/1b-q4_k.gguf
$W/after model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied --seed 1 -o $S > /dev/null
$W/after model synth --size 1b --quant q4_k --seed 1 -o $K > /dev/null
t0=$(date +%s)
bench() { # cfg model threads pp tg tag
  local pre=""; [ "$3" = 2 ] && pre="taskset -c 0,1"
  $pre $W/$1 bench -m $2 -t $3 -p $4 -n $5 -r 1 --warmup 1 --hash-tokens 0 --kernel-timing off -q -o json > $R/$6-$1-r$r.json 2>>$R/bench.err
}
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for c in $order; do
    bench $c $S 2 512 128 smol-t2
    bench $c $S 16 512 128 smol-t16
    bench $c $K 16 512 128 1bq4k-t16
    bench $c $K 2 128 32 1bq4k-t2
  done
  echo "round $r done at $(( $(date +%s) - t0 ))s"
done
timeout 60 $W/po 2,16 > $R/pool_overhead.txt 2>&1
CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=4096 \
  taskset -c 0,1 $W/after serve -m $S --grpc-addr 127.0.0.1:50118 --metrics-addr 127.0.0.1:0 --http-addr "" > $R/serve.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q listening $R/serve.log && break; sleep 0.2; done
timeout 150 taskset -c 4-7 $W/after bench --remote 127.0.0.1:50118 --concurrency 1,8 --requests 16 -n 64 -q --json-out $R/serve-levels.json -o md > $R/serve-levels.md 2>$R/serve-levels.err
timeout 100 taskset -c 4-7 $W/after bench --remote 127.0.0.1:50118 --concurrency '' --mixed 3000 --mixed-stream-tokens 1024 -q --json-out $R/serve-mixed.json -o md > $R/serve-mixed.md 2>$R/serve-mixed.err
kill $pid; wait $pid 2>/dev/null
# (then a python summary of the medians; its table is in stdout.txt)
