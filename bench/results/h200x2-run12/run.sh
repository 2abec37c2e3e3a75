#!/usr/bin/env bash
# This folder's A/B runs, from the repository root at b79495f on the two-H200 machine.
# Usage: bench/results/h200x2-run12/run.sh OUT RUN...   (e.g. before-1 ahead-1 before-2 ahead-2)
#   RUN is NAME-ROUND; NAME is before (4fbb66f: ahead.patch, which is b79495f, taken out) or
#   one of this folder's patches against 4fbb66f: thread, pipe, pipe2, ahead
set -u
here=$(dirname "$0")
out=$1
shift
git apply -R "$here/ahead.patch" || exit 1
export CUDA_VISIBLE_DEVICES=0 LOADS=sdk:64:split PASSES=2
for run in "$@"; do
  name=${run%-*}
  [ "$name" != before ] && git apply "$here/$name.patch"
  bench/run_gpu.sh load "$out/$run" | sed "s/^/$run: /"
  [ "$name" != before ] && git apply -R "$here/$name.patch"
done
git apply "$here/ahead.patch"
