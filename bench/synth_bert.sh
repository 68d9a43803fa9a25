#!/usr/bin/env bash
# Makes random-weight BERT GGUFs of real encoder shapes (BERT-base, bge-small, MiniLM) for the
# embedding benchmarks: bench/synth_bert.py in the same venv as synth_model.sh. Every argument
# goes to synth_bert.py (--help lists them).
#
#   bench/synth_bert.sh --shape bert-base --out /data/synth --types F16,Q8_0
#
# The files are weights: they stay outside the repository (or in ignored paths), never committed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="$("$ROOT/bench/bench_venv.sh")"
exec "$PYTHON" "$ROOT/bench/synth_bert.py" "$@"
