#!/usr/bin/env bash
# h200x2-run20 `1-`: the code as is at 64 and 128 clients, and granian with two runtime
# threads at 64, two rounds on one host. Usage (repository root): run1.sh OUTDIR
set -u
out=$1
patch=bench/results/h200x2-run20/runtime-threads-2.patch
export CUDA_VISIBLE_DEVICES=0 PASSES=2 LOAD_FLAGS="--requests 800"
git apply --check $patch || exit 1
for round in 1 2; do
  LOADS="sdk:64:split sdk:128:split" bench/run_gpu.sh load "$out/asis-$round" | sed "s/^/asis-$round: /"
  git apply $patch || exit 1
  LOADS="sdk:64:split" bench/run_gpu.sh load "$out/rt2-$round" | sed "s/^/rt2-$round: /"
  git apply -R $patch || exit 1
done
