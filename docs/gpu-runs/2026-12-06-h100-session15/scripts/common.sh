# Shared by call1.sh / call2.sh (session 15): paths, binaries, models.
G=$PWD/.gpu; S=$G/15; W=/tmp/s15; mkdir -p $W
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for b in civetta-after civetta-before gpu_check batch_decode_bench-after batch_decode_bench-before; do
  [[ -x $W/$b ]] || { xz -dc $S/$b.xz > $W/$b && chmod +x $W/$b; }
done
KA=$S/kernels-after/sm_90; KB=$S/kernels-before/sm_90
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
