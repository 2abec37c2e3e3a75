#!/usr/bin/env bash
# Where the server's host time goes: the tokenizer beside a busy loop thread (contention.py),
# one load run with native py-spy stacks of the library and the server, then granian and
# uvicorn interleaved, PASSES=4 each. Usage (repository root): run.sh OUTDIR
set -u
out=$1
mkdir -p "$out"
export CUDA_VISIBLE_DEVICES=0 PASSES=4 LOADS=sdk:64:split
here=bench/results/h200x2-diag4
LOAD_FLAGS="--py-spy $out/stacks --native" bench/run_gpu.sh load "$out/profiled"
(cd bench && PYTHONPATH=$PWD/..:$PWD:/tmp/site HF_HUB_OFFLINE=1 taskset -c 0-15 python3 ../$here/contention.py "$out/contention.json")
for http in granian uvicorn granian uvicorn; do
  HTTP=$http bench/run_gpu.sh load "$out/$http-$((n=${n:-0}+1))"
done
