#!/usr/bin/env bash
# Makes (once) the venv the synthetic-model generators run in, with gguf-py and numpy, and
# prints its python. Used by synth_model.sh and synth_bert.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/target/bench-venv"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import gguf, numpy' 2>/dev/null; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet 'gguf==0.19.0' 'numpy>=1.26,<3' >&2
fi
echo "$VENV/bin/python"
