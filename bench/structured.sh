#!/usr/bin/env bash
# The decode cost of structured output: greedy decode tok/s with a JSON-schema constraint
# (`kiln generate --json-schema`) against the same prompt without one (run to the same number
# of tokens with --ignore-eos), alternating A/B ROUNDS times at each thread count; prints each
# pair and the median ratio. The schema is a fixed-length array of small objects, so the
# constrained answer is long (about 500 tokens) and every step computes a mask. The engine also
# times its own grammar work (`stats.grammar_secs`): its share of the decode is the cost with the
# machine's drift taken out.
#
# With LLAMA_SERVER=/path/to/llama-server (and MODEL a .gguf file) the same A/B runs against
# llama-server in the same session: its `response_format` json_schema (GBNF) against the same
# chat without one, run to the same length with ignore_eos, timings from its response.
#
# Usage: ROUNDS=5 THREADS="1 2" [LLAMA_SERVER=…] bench/structured.sh [MODEL]
#        (default MODEL: smollm2; kiln's release build)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-"1 2"}
KILN=${KILN:-target/release/kiln}
[[ -x "$KILN" ]] || cargo build --release --quiet -p kiln
SCHEMA=$(mktemp /tmp/kiln-schema.XXXXXX.json)
trap 'rm -f "$SCHEMA"' EXIT
cat > "$SCHEMA" <<'JSON'
{"type": "array", "minItems": 24, "maxItems": 24, "items": {
  "type": "object", "additionalProperties": false, "required": ["name", "qty", "in_stock"],
  "properties": {"name": {"type": "string", "maxLength": 16},
                 "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                 "in_stock": {"type": "boolean"}}}}
JSON
PROMPT="List 24 grocery items with quantities as a JSON array."
lscpu | grep -E "Model name" | sed 's/  */ /g'
grep -o -w -E 'avx512f|avx512_vnni|avx_vnni|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
echo "kiln level: ${KILN_CPU_LEVEL:-native}  commit: $(git rev-parse --short HEAD)"
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print(v$1)"; }
for t in $THREADS; do
    ratios="" shares=""
    for _ in $(seq "$ROUNDS"); do
        c=$("$KILN" generate "$MODEL" --chat "$PROMPT" --temperature 0 --max-tokens 1024 \
            --json-schema "$SCHEMA" --json --threads "$t" 2>/dev/null)
        n=$(echo "$c" | field "['stats']['generated_tokens']")
        cs=$(echo "$c" | field "['stats']['decode_tokens_per_sec']")
        us=$(echo "$c" | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; \
print(f\"{1e6 * s['grammar_secs'] / max(s['generated_tokens'], 1):.0f}\")")
        echo "$c" | field "['text']" | python3 -c "import json,sys; json.loads(sys.stdin.read())"
        f=$("$KILN" generate "$MODEL" --chat "$PROMPT" --temperature 0 --max-tokens "$n" \
            --ignore-eos --json --threads "$t" 2>/dev/null | field "['stats']['decode_tokens_per_sec']")
        r=$(python3 -c "print(f'{$cs / $f:.3f}')")
        ratios+="$r "
        shares+="$(python3 -c "print($us * $cs / 1e6)") "
        printf 'threads %s  tokens %s  free %.1f tok/s  constrained %.1f tok/s  ratio %s  grammar %s us/token\n' "$t" "$n" "$f" "$cs" "$r" "$us"
    done
    python3 -c "import statistics as s; r=[float(x) for x in '$ratios'.split()]; \
print(f'threads $t: median constrained/free {s.median(r):.3f} (cost {100*(1-s.median(r)):.1f}%) over {len(r)} pairs')"
    python3 -c "import statistics as s; g=[float(x) for x in '$shares'.split()]; \
print(f'threads $t: grammar time is {100*s.median(g):.1f}% of the constrained decode (median)')"
done

[[ -n "${LLAMA_SERVER:-}" ]] || exit 0
[[ -f "$MODEL" ]] || { echo "LLAMA_SERVER needs MODEL to be a .gguf file" >&2; exit 2; }
echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 version)"
PORT=${LLAMA_PORT:-8199}
chat() {
    curl -s "localhost:$PORT/v1/chat/completions" -d "$1" | python3 -c "import json,sys; \
t=json.load(sys.stdin)['timings']; print(t['predicted_n'], t['predicted_per_second'])"
}
for t in $THREADS; do
    "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -t "$t" -c 4096 --no-webui --cache-reuse 0 >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 60); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 1; done
    msgs="[{\"role\": \"user\", \"content\": \"$PROMPT\"}]"
    ratios=""
    for _ in $(seq "$ROUNDS"); do
        read -r n cs < <(chat "{\"temperature\": 0, \"max_tokens\": 1024, \"cache_prompt\": false, \"messages\": $msgs,
            \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": $(cat "$SCHEMA")}}}")
        read -r _ f < <(chat "{\"temperature\": 0, \"max_tokens\": $n, \"ignore_eos\": true, \"cache_prompt\": false, \"messages\": $msgs}")
        r=$(python3 -c "print(f'{$cs / $f:.3f}')")
        ratios+="$r "
        printf 'llama-server threads %s  tokens %s  free %.1f tok/s  constrained %.1f tok/s  ratio %s\n' "$t" "$n" "$f" "$cs" "$r"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 -c "import statistics as s; r=[float(x) for x in '$ratios'.split()]; \
print(f'llama-server threads $t: median constrained/free {s.median(r):.3f} (cost {100*(1-s.median(r)):.1f}%) over {len(r)} pairs')"
done
