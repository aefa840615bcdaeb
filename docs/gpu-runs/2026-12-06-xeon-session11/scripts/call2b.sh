#!/usr/bin/env bash
# Session 11, device call 2b (the same warm Xeon host right after call 2): the #18 cases call 2
# left out, main 34ebe46 vs the lanes build vs the no-AMX llama-bench; 2 threads pinned.
D=$PWD/.gpu/s11/ab; B=$D/civetta-lanes; M=/tmp/cpu-ab-models; export LD_LIBRARY_PATH=$D/llama/bin
for c in "smol-q4_1 16 512 128 3" "smol-q4_1 2 512 128 2" "1b-q4_k 2 128 32 2" "1b-q8_0 2 128 32 2"; do
  read -r name threads pp tg rounds <<< "$c"; pin=(); (( threads < 16 )) && pin=(taskset -c 0-$((threads - 1)))
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$D/llama timeout 150 "${pin[@]}" \
    python3 scripts/perf-ab.py $rounds "$D/civetta" "$B" LLAMA 2>&1
done
