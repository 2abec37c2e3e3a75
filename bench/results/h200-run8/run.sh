#!/usr/bin/env bash
# h200-run8: the server under load on the issue's own machine (one H200, 16 cores), the
# clients on cores of their own (12 server cores and 4 client cores; 8 and 8) or on the
# server's (all 16 shared), taking turns; GPU_TESTS=1 runs the GPU tests first.
# Usage (repository root): [GPU_TESTS=1] bench/results/h200-run8/run.sh OUTDIR ROUND...
set -u
out=$1
shift
export PASSES=2 LOAD_FLAGS="--requests 800"
[ "${GPU_TESTS:-}" = 1 ] && MODELS=" " MIXED="" bench/run_gpu.sh single "$out/gpu" | sed "s/^/gpu: /"
for round in "$@"; do
  SERVER_CORES=0-11 CLIENT_CORES=12-15 LOADS=sdk:64:split bench/run_gpu.sh load "$out/12-4-$round" | sed "s/^/12+4 $round: /"
  SERVER_CORES=0-7 CLIENT_CORES=8-15 LOADS=sdk:64:split bench/run_gpu.sh load "$out/8-8-$round" | sed "s/^/8+8 $round: /"
  LOADS=sdk:64:shared bench/run_gpu.sh load "$out/shared-$round" | sed "s/^/shared $round: /"
done
# RAW=1: the 12+4 placement again with clients that decode base64 with numpy (a core less)
[ "${RAW:-}" = 1 ] && SERVER_CORES=0-11 CLIENT_CORES=12-15 LOADS=raw-base64:64:split bench/run_gpu.sh load "$out/12-4-raw" | sed "s/^/12+4 raw: /"
