#!/usr/bin/env bash
# A load experiment: the `load` stage of bench/run_gpu.sh on the checkout as it is, then with
# PATCH applied, in ROUNDS interleaved rounds on one host (hosts differ more than most
# changes do). LOADS, PASSES, HTTP and LOAD_FLAGS pass through to the stage.
# Usage (repository root): bench/ab_patch.sh PATCH NAME OUTDIR [ROUNDS]
#   results: OUTDIR/before-R/ and OUTDIR/NAME-R/ for each round R
set -u
patch=$1 name=$2 out=$3 rounds=${4:-2}
for round in $(seq "$rounds"); do
  bench/run_gpu.sh load "$out/before-$round" | sed "s/^/before-$round: /"
  git apply "$patch"
  bench/run_gpu.sh load "$out/$name-$round" | sed "s/^/$name-$round: /"
  git apply -R "$patch"
done
