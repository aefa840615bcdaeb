#!/usr/bin/env bash
# Session 11, device call 3b (the Xeon host of the GPU call 3, right after it): #14's CPU serving
# targets on an idle host with the client on other cores than the server. The lanes build (8fe48a7)
# serving the SmolLM2-shaped Q4_1 model on 2 pinned cores, engine.max_decode_slowdown 3 (default,
# "before") vs 2.5 ("after"); concurrency 1 and 8, and the mixed scenario (a 3,000-token prompt
# while 4 streams decode).
set -uo pipefail
D=$PWD/.gpu/s11b
OUT=$OUT/serving SERVER_CPUS=0,1 CLIENT_CPUS=4-7 LEVELS=1,8 MIXED=3000 timeout 200 \
  bash scripts/serving-ab.sh $D/civetta-lanes $D/civetta-sd25 1 2>&1
