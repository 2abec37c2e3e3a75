#!/usr/bin/env bash
# The load stage's setup (bench/run_gpu.sh load), then load.py once per experiment switch
# (sitecustomize.py of this folder), split cores, 64 clients. Usage: run.sh OUTDIR VARIANT...
# where VARIANT is NAME=SWITCHES, switches comma-separated, e.g. step=EXP_STEP=0.001
set -u
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
weights=.carry/minilm-fp16/model.safetensors
if [ -f $weights.xz ]; then
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1] + '.xz'), open(sys.argv[1], 'wb'))" $weights
  rm $weights.xz
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
printf '[models."sentence-transformers/all-MiniLM-L6-v2"]\nsource = "%s"\npooling = "mean"\nmax_seq_len = 256\n' \
  "$PWD/.carry/minilm-fp16" > /tmp/models.toml
export EMBEDX_MODELS_FILE=/tmp/models.toml CUDA_VISIBLE_DEVICES=0
cd bench
for variant in "$@"; do
  name=${variant%%=*} switches=${variant#*=}
  env ${switches//,/ } PYTHONPATH=$here:/tmp/site:$PYTHONPATH timeout 150 python3 load.py --clients 64 --passes ${PASSES:-2} \
    --server-cores 0-15 --client-cores 16-31 --client-processes 16 \
    --out "$out/load-$name.json" >"$out/load-$name.log" 2>&1
  echo "$name: $(python3 summarize.py "$out/load-$name.json")"
done
