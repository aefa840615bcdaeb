#!/usr/bin/env bash
# #14 serving on the idle Xeon host, 2 pinned server cores: before (main d148780) vs after (merged
# main), concurrency 1,8,16; then prefix-cache TTFT over HTTP (after only).
set -uo pipefail
R=$OUT/14; mkdir -p $R; W=/tmp/r14; mkdir -p $W
gzip -dc .gpu/18/civetta-before.gz > $W/before && chmod +x $W/before
cp .gpu/14/civetta $W/after && chmod +x $W/after
lscpu | grep -E "Model name|^CPU\(s\)" > $R/cpu.txt
OUT_SAVE=$OUT
OUT=$W/ab LEVELS=1,8,16 timeout 330 bash scripts/serving-ab.sh $W/before $W/after 2 2>&1 | tee $R/serving-ab.md | tail -8
cp $W/ab/*.json $R/ 2>/dev/null
OUT=$OUT_SAVE
M=$W/ab/smollm2-shaped-q4_1.gguf
CIVETTA_ENGINE__THREADS=2 CIVETTA_ENGINE__CONTEXT_LENGTH=2048 taskset -c 0,1 $W/after serve -m $M --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr 127.0.0.1:8099 > $R/serve-prefix.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q listening $R/serve-prefix.log && break; sleep 0.2; done
timeout 120 taskset -c 4-7 python3 .gpu/14/prefix_ttft.py http://127.0.0.1:8099 2>&1 | tee $R/prefix-ttft.txt
kill $pid; wait $pid 2>/dev/null
