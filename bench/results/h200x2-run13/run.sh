#!/usr/bin/env bash
# This folder's runs, from the repository root on the two-H200 machine.
# Usage: bench/results/h200x2-run13/run.sh OUT RUN...   (e.g. t-1 s05-1)
#   RUN is NAME-ROUND. With timeline.patch applied, each run records every request's and
#   tokenizer call's clocks (OUT/RUN/timeline-PID.json, the server's and the library's; read
#   them with timeline.py); NAME
#   picks the environment: t (as is), s05 (EXP_SWITCH_S=0.0005: a 0.5 ms switch interval),
#   r14 (RAYON_NUM_THREADS=14: the tokenizer's pool two threads short of the 16 cores, in the
#   library and the server alike).
set -u
here=$(dirname "$0")
out=$1
shift
git apply "$here/timeline.patch" || exit 1
export CUDA_VISIBLE_DEVICES=0 LOADS=sdk:64:split PASSES=2
for run in "$@"; do
  name=${run%-*}
  mkdir -p "$out/$run"
  switch= rayon=
  [ "$name" = s05 ] && switch=0.0005
  [ "$name" = r14 ] && rayon=14
  RAYON_NUM_THREADS=$rayon EXP_SWITCH_S=$switch EXP_TIMELINE=$(cd "$out/$run" && pwd)/timeline bench/run_gpu.sh load "$out/$run" | sed "s/^/$run: /"
  for f in "$out/$run"/timeline-*.json; do python3 "$here/timeline.py" "$f"; done
done
git apply -R "$here/timeline.patch"
