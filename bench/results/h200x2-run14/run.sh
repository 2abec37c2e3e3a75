#!/usr/bin/env bash
# This folder's runs, from the repository root on an H200 machine.
# Usage: bench/results/h200x2-run14/run.sh OUT RUN...   (e.g. glibc-1 jemalloc-1)
#   RUN is NAME-ROUND; NAME picks the allocator of the library, the server and the clients
#   alike: glibc (as is), jemalloc (LD_PRELOAD of Debian's libjemalloc.so.2 5.3.0, carried
#   as .carry/jemalloc/libjemalloc.so.2).
#   STAGE=load (default): bench/run_gpu.sh's load stage (LOADS, PASSES, LOAD_MODEL pass on).
#   STAGE=throughput: bench/throughput.py MODEL (minilm) on cores 0-15, embedx and
#   tokenizing alone, five timed runs.
#   STAGE=timeline: the load stage with ../h200x2-run13/timeline.patch applied (every
#   request's clocks, OUT/RUN/timeline-PID.json, summed by its timeline.py); NAME is then
#   before (as is) or eager (eager.patch: the server's tasks start eagerly).
set -u
out=$1
shift
export CUDA_VISIBLE_DEVICES=0 LOADS=${LOADS:-sdk:64:split} PASSES=${PASSES:-2}
for run in "$@"; do
  name=${run%-*}
  if [ "${STAGE:-load}" = timeline ]; then
    mkdir -p "$out/$run"
    git apply bench/results/h200x2-run13/timeline.patch || exit 1
    [ "$name" = eager ] && git apply bench/results/h200x2-run14/eager.patch
    EXP_TIMELINE=$(cd "$out/$run" && pwd)/timeline bench/run_gpu.sh load "$out/$run" | sed "s/^/$run: /"
    [ "$name" = eager ] && git apply -R bench/results/h200x2-run14/eager.patch
    git apply -R bench/results/h200x2-run13/timeline.patch
    for f in "$out/$run"/timeline-*.json; do python3 bench/results/h200x2-run13/timeline.py "$f"; done
    continue
  fi
  preload=
  [ "$name" = jemalloc ] && preload=$PWD/.carry/jemalloc/libjemalloc.so.2
  if [ "${STAGE:-load}" = throughput ]; then
    bench/run_gpu.sh none "$out" >/dev/null  # unpacks the carried weights
    (cd bench && PYTHONPATH=$PWD/.. HF_HUB_OFFLINE=1 LD_PRELOAD=$preload taskset -c 0-15 \
      python3 throughput.py "${MODEL:-minilm}" --skip transformers sentence_transformers --runs 5 \
      --out "$out/throughput-${MODEL:-minilm}-$run.json" >"$out/throughput-${MODEL:-minilm}-$run.log" 2>&1
      python3 summarize.py "$out/throughput-${MODEL:-minilm}-$run.json" | sed "s/^/$run: /")
  else
    LD_PRELOAD=$preload bench/run_gpu.sh load "$out/$run" | sed "s/^/$run: /"
  fi
done
