#!/usr/bin/env bash
# Session 22, call c2c (#14): two more rounds of c2's CPU mixed-scenario A/B on the Xeon host (the
# machine of c2, still warm): main's planner (civetta) against the whole-step bound (civetta-new).
set -u; G=$PWD/.gpu/22; W=/tmp/s22; O=$OUT/c2c; mkdir -p $O/cpu-mixed
ln -sf $W/smol.gguf $O/cpu-mixed/smollm2-shaped-q4_1.gguf
OUT=$O/cpu-mixed SERVER_CPUS=0,1 CLIENT_CPUS=4-7 LEVELS=1 REQUESTS=4 MIXED=3000 MIXED_CONTROL=1 \
  timeout 280 bash $G/serving-ab.sh $W/civetta $W/civetta-new 2 2>&1 | tail -8
tar czf $OUT/c2c.tgz -C $OUT c2c
