#!/usr/bin/env bash
# Session 15, call C (warm, right after callB.sh; ran as one inline command): the daemon serving the
# 1.4B Q8_0 file with each build in turn (before, after, before, after), `civetta bench --remote
# --concurrency 1,16 --requests 32 -n 64` from a separate process. Into $OUT/c.tgz.
source .gpu/15/common.sh; O=$OUT/c; mkdir -p $O
for r in 1 2; do for b in before after; do K=$KA; [[ $b == before ]] && K=$KB
  CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$K CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    setsid $W/civetta-$b serve -m $W/m-q8_0.gguf --grpc-addr 127.0.0.1:50091 --metrics-addr 127.0.0.1:9591 > $O/serve-$b-$r.log 2>&1 < /dev/null & sp=$!
  for _ in $(seq 60); do grep -q listening $O/serve-$b-$r.log && break; sleep 1; done
  timeout 60 $W/civetta-after bench --remote 127.0.0.1:50091 --concurrency 1,16 --requests 32 -n 64 -q -o md > $O/serving-$b-$r.md 2>&1
  echo "== $b $r"; grep -E "^\| (1|16) " $O/serving-$b-$r.md; kill $sp; wait $sp 2>/dev/null
done; done; tar czf $OUT/c.tgz -C $OUT c
