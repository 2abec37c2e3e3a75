#!/usr/bin/env bash
# The commands behind the README's measured results, on a device machine (see DEPLOY.md).
# Usage: bench/run_gpu.sh STAGE OUTDIR   (run from the repository root)
#   single   one H200, 16 cores: GPU tests, throughput of every model, GPU + CPU pair
#   two      two H200s: throughput on both, and the converging queue with a co-tenant on GPU 1
#   load     the server under concurrent OpenAI SDK clients, against the library
set -u
stage=$1
out=$2
mkdir -p "$out"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
cores="taskset -c 0-15"  # the issue's reference machine has 16 cores
cd bench
case $stage in
single)
  timeout 120 python3 -m pytest -q -m gpu ../tests/test_gpu.py -p no:cacheprovider -o addopts="" >"$out/pytest.txt" 2>&1
  tail -2 "$out/pytest.txt"
  for model in ${MODELS:-minilm bert-base bert-large xlm-roberta-large qwen3-0.6b}; do
    timeout 240 $cores python3 throughput.py $model --peer-fraction 0.1 \
      --out "$out/throughput-$model.json" >"$out/throughput-$model.log" 2>&1
    python3 summarize.py "$out/throughput-$model.json"
  done
  for model in ${MIXED:-minilm bert-large}; do
    timeout 240 $cores python3 mixed.py $model --devices 0,cpu --runs 9 --out "$out/mixed-$model-gpu-cpu.json" \
      >"$out/mixed-$model-gpu-cpu.log" 2>&1
    python3 summarize.py "$out/mixed-$model-gpu-cpu.json"
  done
  ;;
two)
  for model in minilm bert-large; do
    for devices in 0 0,1; do
      name=$([ $devices = 0 ] && echo one-gpu || echo two-gpus)
      timeout 120 python3 throughput.py $model --devices $devices --skip transformers sentence_transformers \
        --out "$out/throughput-$model-$name.json" >"$out/throughput-$model-$name.log" 2>&1
      python3 summarize.py "$out/throughput-$model-$name.json"
    done
  done
  # where the host's time goes with two GPUs: claims, launches, event-loop stalls
  timeout 120 python3 timeline.py bert-large --devices 0,1 --out "$out/timeline-bert-large-two-gpus.json" \
    >"$out/timeline-bert-large-two-gpus.log" 2>&1
  # two co-tenant processes share GPU 1 with us: time-slicing leaves us about a third of it
  python3 cotenant.py --device 1 --seconds 400 & python3 cotenant.py --device 1 --seconds 400 &
  sleep 5
  for model in bert-large minilm; do
    timeout 200 python3 mixed.py $model --devices 0,1 --static --oracle-grid 0.55 0.65 0.75 0.85 \
      --note "GPU 1 shared with two co-tenant processes running bf16 8192^3 matrix products" \
      --out "$out/mixed-$model-cotenant.json" >"$out/mixed-$model-cotenant.log" 2>&1
    python3 summarize.py "$out/mixed-$model-cotenant.json"
  done
  kill %1 %2 2>/dev/null
  ;;
load)
  # the server needs its HTTP stack, carried as wheels, and MiniLM from the carried copy
  python3 -m pip install -q --no-index --no-deps --target /tmp/site ../.whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  printf '[models."sentence-transformers/all-MiniLM-L6-v2"]\nsource = "%s"\npooling = "mean"\nmax_seq_len = 256\n' \
    "$(cd .. && pwd)/.carry/minilm-fp16" > /tmp/models.toml
  export EMBEDX_MODELS_FILE=/tmp/models.toml
  # Each run is DECODING:CLIENTS:CORES. Decoding: the SDK's default (it asks for base64 and
  # makes Python floats of every row), or raw-base64 (clients ask for base64 themselves and
  # decode with numpy). Cores: the library and the server get cores 0-15 either way; "split"
  # puts the clients on cores 16-31, as clients on other machines would be (it needs 32
  # cores), "shared" leaves them on the server's cores.
  for run in ${LOADS:-sdk:32:shared sdk:64:shared sdk:128:shared raw-base64:128:shared}; do
    IFS=: read -r decoding clients placement <<<"$run"
    flags="--server-cores 0-15"
    [ $decoding = raw-base64 ] && flags="$flags --raw-base64"
    [ $placement = split ] && flags="$flags --client-cores 16-31 --client-processes 8"
    name=load-minilm-$decoding-$clients-$placement
    timeout 200 python3 load.py --clients $clients --passes 2 $flags \
      --out "$out/$name.json" >"$out/$name.log" 2>&1
    python3 summarize.py "$out/$name.json"
  done
  ;;
esac
