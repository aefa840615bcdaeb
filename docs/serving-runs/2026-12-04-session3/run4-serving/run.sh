#!/usr/bin/env bash
# #19/#14: gRPC vs HTTP serving and the mixed scenario on the idle Xeon host, server on 2 pinned cores.
# NEEDS .gpu/19/civetta: a stripped release binary of issue-19 (or of main after the merge) — NOT built yet.
set -uo pipefail
R=$OUT/19; mkdir -p $R; W=/tmp/r19; mkdir -p $W
B=$W/civetta; cp .gpu/19/civetta $B && chmod +x $B
lscpu | grep -E "Model name|^CPU\(s\)" > $R/cpu.txt
M=$W/smollm2-shaped-q4_1.gguf
$B model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 \
  --vocab 49152 --tied --context 4096 --seed 1 -o $M > /dev/null
CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=4096 \
  taskset -c 0,1 $B serve -m $M --grpc-addr 127.0.0.1:50119 --metrics-addr 127.0.0.1:0 --http-addr 127.0.0.1:8119 > $R/serve.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q listening $R/serve.log && break; sleep 0.2; done
timeout 200 taskset -c 4-7 $B bench --remote 127.0.0.1:50119 --remote-http http://127.0.0.1:8119 --concurrency 1,8,16 \
  --requests 16 -n 64 -q --json-out $R/levels.json -o md > $R/levels.md 2>$R/levels.err
timeout 200 taskset -c 4-7 $B bench --remote 127.0.0.1:50119 --remote-http http://127.0.0.1:8119 --concurrency '' \
  --mixed 3000 --mixed-stream-tokens 1024 -q --json-out $R/mixed.json -o md > $R/mixed.md 2>$R/mixed.err
kill $pid; wait $pid 2>/dev/null
cat $R/levels.md $R/mixed.md | grep -E "^\||WARNING"
# before: main at the start of this session (9e0d190, the server side only; the client is the new one)
cp .gpu/19/civetta-before $W/before && chmod +x $W/before
CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=4096 \
  taskset -c 0,1 $W/before serve -m $M --grpc-addr 127.0.0.1:50120 --metrics-addr 127.0.0.1:0 --http-addr "" > $R/serve-before.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q listening $R/serve-before.log && break; sleep 0.2; done
timeout 150 taskset -c 4-7 $B bench --remote 127.0.0.1:50120 --concurrency 1,8,16 --requests 16 -n 64 -q --json-out $R/before-levels.json -o md > $R/before-levels.md 2>$R/before-levels.err
timeout 100 taskset -c 4-7 $B bench --remote 127.0.0.1:50120 --concurrency '' --mixed 3000 --mixed-stream-tokens 1024 -q --json-out $R/before-mixed.json -o md > $R/before-mixed.md 2>$R/before-mixed.err
kill $pid; wait $pid 2>/dev/null
echo "== before (9e0d190 server)"; cat $R/before-levels.md $R/before-mixed.md | grep -E "^\||WARNING"; cat $R/mixed.err $R/before-mixed.err | grep -i fail
