#!/usr/bin/env bash
# mixed scenario with one binary and one slowdown setting
bin=$1 slow=$2 port=$3
M=/tmp/m4/serving/smollm2-shaped-q4_1.gguf
env CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__MAX_QUEUE=64 CIVETTA_ENGINE__CONTEXT_LENGTH=4096 \
  CIVETTA_ENGINE__MAX_DECODE_SLOWDOWN=$slow taskset -c 0,1 $bin serve -m $M --grpc-addr 127.0.0.1:$port --metrics-addr 127.0.0.1:0 > /tmp/m4/mixed-$slow.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q listening /tmp/m4/mixed-$slow.log && break; sleep 0.2; done
/tmp/m4/civetta-after bench --remote 127.0.0.1:$port --concurrency '' --mixed 3000 --mixed-stream-tokens 2048 -q 2>&1 | grep -v "^$" | tail -6
kill $pid; wait $pid 2>/dev/null
