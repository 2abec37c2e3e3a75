#!/usr/bin/env bash
# The server's tokenizer on fewer threads than the library's (RAYON_NUM_THREADS in the server
# alone, through load.py's server environment): VARIANTS in order, each a patch name here or
# "before" for the checkout as is; one `load` stage each, 12 cores for the server and the
# library, 4 for the clients. Usage (repository root): bench/results/h200-run12/run.sh OUT VARIANT...
set -u
out=$1; shift
here=bench/results/h200-run12
for variant in "$@"; do
  [ "$variant" != before ] && { git apply "$here/$variant.patch" || exit 1; }
  SERVER_CORES=0-11 CLIENT_CORES=12-15 PASSES=2 LOADS="sdk:64:split" bench/run_gpu.sh load "$out/$variant" | sed "s/^/$variant: /"
  [ "$variant" != before ] && { git apply -R "$here/$variant.patch" || exit 1; }
done
