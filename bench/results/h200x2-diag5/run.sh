#!/usr/bin/env bash
# The server's base64 path as main has it (binascii on the loop's thread) against
# numpy-base64.patch (cf4efa0, since reverted: numpy calls on a worker thread), interleaved
# on one host, 64 SDK clients, split cores, PASSES=4. Usage (repository root): run.sh OUTDIR [ROUNDS]
set -u
out=$1 rounds=${2:-3}
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES=0 PASSES=4 LOADS=sdk:64:split
patch=bench/results/h200x2-diag5/numpy-base64.patch
for round in $(seq "$rounds"); do
  for variant in before after; do
    [ $variant = after ] && git apply $patch
    bench/run_gpu.sh load "$out/$variant-$round" 2>&1 | grep -v "^WARNING: Target"
    [ $variant = after ] && git apply -R $patch
  done
done
