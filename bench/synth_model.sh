#!/usr/bin/env bash
# Makes random-weight GGUFs of real model shapes (1B, 3B, 8B, Qwen3-4B) for the speed and memory
# benchmarks: bench/synth_model.py in a venv with gguf-py, the donor tokenizer from kiln's starter
# model unless --donor is given. Every argument goes to synth_model.py (--help lists them).
#
#   bench/synth_model.sh --shape 3b --out /data/synth --types Q4_K_M,Q8_0
#
# The files are weights: they stay outside the repository (or in ignored paths), never committed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="$("$ROOT/bench/bench_venv.sh")"
ARGS=("$@")
if [[ " $* " != *" --donor "* && " $* " != *" -h "* && " $* " != *" --help "* ]]; then
    KILN_BIN="${KILN_BIN:-$ROOT/target/release/kiln}"
    [[ -x "$KILN_BIN" ]] || { echo "synth_model.sh: no --donor and no kiln at $KILN_BIN to pull the starter" >&2; exit 2; }
    ARGS+=(--donor "$("$KILN_BIN" pull --quiet | tail -n 1)")
fi
exec "$PYTHON" "$ROOT/bench/synth_model.py" "${ARGS[@]}"
