#!/usr/bin/env bash
# Concurrent streaming clients against `kiln serve` and `llama-server` on the same GGUF and
# threads, alternating the two servers ROUNDS times for each client count so machine noise
# falls on both; prints one JSON line per (round, server, clients) from bench/concurrent.py.
#
# Each server is started fresh for each client count: llama-server with `-np N -c 2048·N
# --jinja` (N = clients, as a user sizes it), kiln with its defaults (`--parallel` from the
# memory budget).
#
# Usage: bench/serve_compare.sh [CLIENTS...]     (default: 1 8 32)
# Environment: KILN_BIN (target/release/kiln), LLAMA_SERVER (llama-server on PATH), MODEL
# (the starter model), THREADS (2), ROUNDS (2), REQUESTS per client (2), MAX_TOKENS (128),
# KILN_ARGS (extra `kiln serve` flags, e.g. "--parallel 8").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_BIN=${KILN_BIN:-$ROOT/target/release/kiln}
LLAMA_SERVER=${LLAMA_SERVER:-llama-server}
MODEL=${MODEL:-$("$KILN_BIN" pull --quiet)}
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-2} REQUESTS=${REQUESTS:-2} MAX_TOKENS=${MAX_TOKENS:-128}
KILN_ARGS=${KILN_ARGS:-}
CLIENTS=("$@")
[[ ${#CLIENTS[@]} -gt 0 ]] || CLIENTS=(1 8 32)
PORT=18437

wait_up() {
    for _ in $(seq 200); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server did not come up" >&2
    return 1
}

run_one() { # name clients command...
    local name=$1 n=$2
    shift 2
    "$@" >/tmp/serve_compare_$name.log 2>&1 &
    local pid=$!
    wait_up
    local out
    out=$(python3 "$ROOT/bench/concurrent.py" "http://127.0.0.1:$PORT" "$n" \
        --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" --json)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    echo "{\"server\": \"$name\", ${out#\{}"
}

for n in "${CLIENTS[@]}"; do
    for r in $(seq "$ROUNDS"); do
        # shellcheck disable=SC2086
        run_one kiln "$n" "$KILN_BIN" serve "$MODEL" --port $PORT -t "$THREADS" $KILN_ARGS
        run_one llama-server "$n" "$LLAMA_SERVER" -m "$MODEL" --port $PORT -t "$THREADS" \
            -np "$n" -c $((2048 * n)) --jinja
    done
done
