#!/usr/bin/env bash
# h200-run9: the server with `gather.patch` (an idle device waits up to EXP_GATHER_MS for
# EXP_GATHER_TOKENS to queue while texts still arrive, so batches are fewer and larger)
# against the code as is, taking turns on one H200's 16 cores, 12 for the server and the
# library, 4 for numpy-decoding clients. Usage (repository root): run.sh OUTDIR [ROUNDS]
set -u
export SERVER_CORES=0-11 CLIENT_CORES=12-15 LOADS=raw-base64:64:split PASSES=2 LOAD_FLAGS="--requests 800"
bench/ab_patch.sh bench/results/h200-run9/gather.patch gather "$1" "${2:-2}"
