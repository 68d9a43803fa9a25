#!/usr/bin/env bash
# Embedding throughput of `kiln serve` against `llama-server --embedding` on the same BERT GGUF
# and threads, alternating the two servers ROUNDS times so machine noise falls on both; one
# JSON line per (round, server) from bench/embed_load.py.
#
# llama-server runs with `-np 8 -c 4096` (eight 512-token slots, so a request's inputs are
# embedded together); kiln with its defaults plus KILN_ARGS.
#
# Usage: bench/embed_compare.sh MODEL.gguf      (files from bench/synth_bert.sh)
# Environment: KILN_BIN (target/release/kiln), LLAMA_SERVER (llama-server on PATH), THREADS (2),
# ROUNDS (3), CLIENTS (2), BATCH (16 inputs per request), REQUESTS (2 per client), TOKENS (128).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=${1:?usage: embed_compare.sh MODEL.gguf}
KILN_BIN=${KILN_BIN:-$ROOT/target/release/kiln}
LLAMA_SERVER=${LLAMA_SERVER:-llama-server}
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-3} CLIENTS=${CLIENTS:-2} BATCH=${BATCH:-16}
REQUESTS=${REQUESTS:-2} TOKENS=${TOKENS:-128} KILN_ARGS=${KILN_ARGS:-}
PORT=18438

wait_up() {
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server did not come up" >&2
    return 1
}

run_one() { # name command...
    local name=$1
    shift
    "$@" >/tmp/embed_compare_$name.log 2>&1 &
    local pid=$!
    wait_up
    local out
    out=$(python3 "$ROOT/bench/embed_load.py" "http://127.0.0.1:$PORT" --clients "$CLIENTS" \
        --batch "$BATCH" --requests "$REQUESTS" --tokens "$TOKENS" --json)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    echo "{\"server\": \"$name\", \"model\": \"$(basename "$MODEL")\", ${out#\{}"
}

echo "# $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores, kiln $(git -C "$ROOT" rev-parse --short HEAD), KILN_CPU_LEVEL=${KILN_CPU_LEVEL:-native}"
for r in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    run_one kiln "$KILN_BIN" serve "$MODEL" --port $PORT -t "$THREADS" $KILN_ARGS
    run_one llama-server "$LLAMA_SERVER" -m "$MODEL" --embedding --port $PORT -t "$THREADS" \
        -np 8 -c 4096
done
