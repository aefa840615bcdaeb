#!/usr/bin/env bash
# Blocks until .gpu/llama/build.sh has finished; exit 0 when llama-bench is there.
for _ in $(seq 900); do [[ -f /tmp/llama.cpp/build.rc ]] && break; sleep 1; done
tail -3 /tmp/llama.cpp/build.log
[[ "$(cat /tmp/llama.cpp/build.rc 2>/dev/null)" == 0 && -x /tmp/llama.cpp/build/bin/llama-bench ]]
