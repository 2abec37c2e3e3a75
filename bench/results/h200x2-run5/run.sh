#!/usr/bin/env bash
# Mixed GPUs with a co-tenant on GPU 1, before and after a3c00f9 + 6ab603d (change.patch:
# launch costs in the scheduler, every bucketed row count warmed at load), interleaved on
# one host: MiniLM in ROUNDS rounds, BERT-large once each.
# Usage (repository root, on the two-H200 machine): bench/results/h200x2-run5/run.sh OUT [ROUNDS]
set -u
out=$1 rounds=${2:-2}
here=bench/results/h200x2-run5
bench/run_gpu.sh unpack "$out"  # no such stage: it only unpacks the carried weights
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
note="GPU 1 shared with two co-tenant processes running bf16 8192^3 matrix products"
(cd bench && exec python3 cotenant.py --device 1 --seconds 500) &
(cd bench && exec python3 cotenant.py --device 1 --seconds 500) &
sleep 5
run() {  # VARIANT MODEL RUNS NAME
  [ "$1" = before ] && git apply -R $here/change.patch
  (cd bench && timeout 150 taskset -c 0-15 python3 mixed.py "$2" --devices 0,1 --runs "$3" --note "$note" \
    --out "$out/$4.json" >"$out/$4.log" 2>&1; python3 summarize.py "$out/$4.json" | sed "s/^/$4: /")
  [ "$1" = before ] && git apply $here/change.patch
}
for round in $(seq "$rounds"); do
  for variant in before after; do
    run $variant minilm 9 mixed-minilm-cotenant-$variant-$round
  done
done
for variant in before after; do
  run $variant bert-large 3 mixed-bert-large-cotenant-$variant
done
kill %1 %2 2>/dev/null
