#!/usr/bin/env bash
# A load experiment: the `load` stage of bench/run_gpu.sh on the checkout as it is, then with
# PATCH applied, in ROUNDS interleaved rounds on one host (hosts differ more than most
# changes do). LOADS, PASSES, HTTP and LOAD_FLAGS pass through to the stage.
# Usage (repository root): bench/ab_patch.sh PATCH NAME OUTDIR [ROUNDS]
#   results: OUTDIR/before-R/ and OUTDIR/NAME-R/ for each round R
set -u
patch=$1 name=$2 out=$3 rounds=${4:-2}
# A patch that does not apply would leave the variant's runs measuring the code as is, under
# the variant's name: check first, and stop at any failure to apply or revert.
git apply --check "$patch" || { echo "ab_patch.sh: $patch does not apply to this tree" >&2; exit 1; }
for round in $(seq "$rounds"); do
  bench/run_gpu.sh load "$out/before-$round" | sed "s/^/before-$round: /"
  git apply "$patch" || exit 1
  bench/run_gpu.sh load "$out/$name-$round" | sed "s/^/$name-$round: /"
  git apply -R "$patch" || exit 1
done
