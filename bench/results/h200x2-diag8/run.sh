#!/usr/bin/env bash
# The tokenizer's two threads (tokenizer-threads.patch, not kept: one thread encodes, one
# takes the ids out) against main's async tokenizer calls handed out by the event loop, on
# one host, interleaved, 64 SDK clients, split cores, PASSES=3.
# Usage (repository root): run.sh OUTDIR [ROUNDS]
set -u
out=$1 rounds=${2:-2}
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES=0 PASSES=${PASSES:-3} LOADS=sdk:64:split
patch=bench/results/h200x2-diag8/tokenizer-threads.patch
for round in $(seq "$rounds"); do
  for variant in before threads; do
    [ $variant = threads ] && git apply $patch
    bench/run_gpu.sh load "$out/$variant-$round" 2>&1 | grep -v "^WARNING: Target" | sed "s/^/$variant-$round: /"
    [ $variant = threads ] && git apply -R $patch
  done
done
