# Shared by the session 17 calls: paths, binaries, models.
# s16 = main 35f4784's code (session 16's binary); A = + timed replay at the n-th replay, capture
# logs; B = A + KV caches pooled by exact size (graphs replay across requests).
G=$PWD/.gpu; S=$G/17; W=/tmp/s17; mkdir -p $W
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for b in $S/*.xz; do n=$(basename $b .xz); [[ -x $W/$n ]] || { xz -dc $b > $W/$n && chmod +x $W/$n; }; done
K=$S/kernels
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
synth() { for q in "$@"; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-D model synth $SZ --quant $q -o $W/tmp-$q.gguf > /dev/null && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; }
