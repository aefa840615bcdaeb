#!/usr/bin/env bash
# Session 20: session 19's rate-1 timing cost (calls 3 and 4: Q8_0 and Q4_K) on the H200.
bash .gpu/20/call3.sh; bash .gpu/20/call4.sh
rm -rf $OUT/c3 $OUT/c4
