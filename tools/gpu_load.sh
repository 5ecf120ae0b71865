#!/usr/bin/env bash
# One device-tool command for the GPU load path: the CUDA tests, then `tensorfold bench` of the after binary
# (.device/tensorfold) and the before binary (.device/tensorfold-before) alternated from a warm page cache, each
# line with the load's own split (packing and copying the weights), then one server bench of the after binary.
#
# Usage (after `bash tools/device_build.sh`, with the before binary stripped into .device/tensorfold-before, and
# .device carried): bash tools/gpu_load.sh; results in $OUT (load.txt, bench.txt, tests.txt, logs.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-load-out}"
mkdir -p "$OUT"
export TF_CACHE_DIR=/tmp/tfc; CKPT=/tmp/tensorfold-bench/llama-3.1-8b
timeout 150 .device/cuda-tests --test-threads 1 2>&1 | grep -E "^test |test result|panicked" | tee $OUT/tests.txt
[ -f $CKPT/config.json ] || timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --out $CKPT > $OUT/ckpt.log 2>&1
cat $CKPT/*.safetensors > /dev/null
for b in after before after before after; do
  bin=.device/tensorfold; [ $b = before ] && bin=.device/tensorfold-before
  t0=$(date +%s.%N)
  TF_LOG=info timeout 120 $bin bench --device cuda --model $CKPT --prompt-tokens 16 --decode-tokens 16 --repeats 1 > $OUT/$b.json 2> $OUT/$b.log
  t1=$(date +%s.%N)
  echo "$b wall $(python3 -c "print(round($t1 - $t0, 2))") s; $(sed 's/\x1b\[[0-9;]*m//g' $OUT/$b.log | grep -E 'weights on the GPU| ready ' | sed 's/^.*INFO //' | tr '\n' ' ') $(cat $OUT/$b.json)"
done | tee $OUT/load.txt
timeout 140 bash tools/bench_gpu.sh --binary .device/tensorfold --out $OUT/b --ckpt $CKPT --skip peer --skip bandwidth --streams 256 --ttft-repeats 1 --deadline 300 > /dev/null 2>&1
grep -E "batch-1 decode tok/s|256 streams total|TTFT ms, best" $OUT/b/results.md | tee $OUT/bench.txt; grep -o '"ready_s": [0-9.]*' $OUT/b/*.json | tee -a $OUT/bench.txt
rm -rf $OUT/b $OUT/*.json; cd $OUT && tar czf /tmp/l.tgz *.log && rm -f *.log && mv /tmp/l.tgz logs.tgz
