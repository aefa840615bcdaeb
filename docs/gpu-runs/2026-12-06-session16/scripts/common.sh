# Shared by call1.sh / call2.sh (session 16): paths, binaries, models.
# s15 = session 15's build (main 12f9803's code) with its kernels; new = this session's build with
# its kernels, run with overlapped launches (default) and without (--gpu-overlap-launches false).
G=$PWD/.gpu; S=$G/16; W=/tmp/s16; mkdir -p $W
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for b in civetta-new gpu_check batch_decode_bench-new; do
  [[ -x $W/$b ]] || { xz -dc $S/$b.xz > $W/$b && chmod +x $W/$b; }
done
[[ -x $W/civetta-s15 ]] || { xz -dc $G/15/civetta-after.xz > $W/civetta-s15 && chmod +x $W/civetta-s15; }
[[ -x $W/batch_decode_bench-s15 ]] || { xz -dc $G/15/batch_decode_bench-after.xz > $W/batch_decode_bench-s15 && chmod +x $W/batch_decode_bench-s15; }
KN=$S/kernels-new/sm_90; K15=$G/15/kernels-after/sm_90
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
