#!/usr/bin/env bash
# Session 10, device call 1: #18 on the idle Xeon host. main 394e84a (Q4_K repacked) vs the same
# binary with --cpu-repack=false vs the no-AMX llama-bench; 2 threads pinned, 16 threads.
set -uo pipefail
D=$PWD/.gpu/s10/ab; O=$OUT/18; mkdir -p $O
nproc; free -g | head -2
ROUNDS=2 BUDGET=480 CASES="smol-q4_1 16 512 128;1b-q4_k 16 512 128;1b-q4_k 2 128 32;smol-q4_1 2 512 128;1b-q8_0 16 512 128;1b-q8_0 2 128 32" \
  timeout 580 bash scripts/cpu-ab-device.sh $D $O
