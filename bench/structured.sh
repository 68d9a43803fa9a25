#!/usr/bin/env bash
# The decode cost of structured output: greedy decode tok/s with a JSON-schema constraint
# (`kiln generate --json-schema`) against the same prompt without one (run to the same number
# of tokens with --ignore-eos), alternating A/B ROUNDS times at each thread count; prints each
# pair and the median ratio. The schema is a fixed-length array of small objects, so the
# constrained answer is long (about 500 tokens) and every step computes a mask.
#
# Usage: ROUNDS=5 THREADS="1 2" bench/structured.sh [MODEL]   (default: smollm2, release build)
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
    ratios=""
    for _ in $(seq "$ROUNDS"); do
        c=$("$KILN" generate "$MODEL" --chat "$PROMPT" --temperature 0 --max-tokens 1024 \
            --json-schema "$SCHEMA" --json --threads "$t" 2>/dev/null)
        n=$(echo "$c" | field "['stats']['generated_tokens']")
        cs=$(echo "$c" | field "['stats']['decode_tokens_per_sec']")
        echo "$c" | field "['text']" | python3 -c "import json,sys; json.loads(sys.stdin.read())"
        f=$("$KILN" generate "$MODEL" --chat "$PROMPT" --temperature 0 --max-tokens "$n" \
            --ignore-eos --json --threads "$t" 2>/dev/null | field "['stats']['decode_tokens_per_sec']")
        r=$(python3 -c "print(f'{$cs / $f:.3f}')")
        ratios+="$r "
        printf 'threads %s  tokens %s  free %.1f tok/s  constrained %.1f tok/s  ratio %s\n' "$t" "$n" "$f" "$cs" "$r"
    done
    python3 -c "import statistics as s; r=[float(x) for x in '$ratios'.split()]; \
print(f'threads $t: median constrained/free {s.median(r):.3f} (cost {100*(1-s.median(r)):.1f}%) over {len(r)} pairs')"
done
