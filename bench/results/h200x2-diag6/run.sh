#!/usr/bin/env bash
# Each tokenizer call's clocks in the library and in the server (sitecustomize.py of this
# folder), one load run of 64 SDK clients, split cores. Usage (repository root): run.sh OUTDIR
set -u
out=$1
mkdir -p "$out"
lscpu -e > "$out/lscpu.txt"
export CUDA_VISIBLE_DEVICES=0 PASSES=${PASSES:-3} LOADS=sdk:64:split TOKCALLS=$out/tokcalls
PYTHONPATH=$PWD/bench/results/h200x2-diag6 bench/run_gpu.sh load "$out"
