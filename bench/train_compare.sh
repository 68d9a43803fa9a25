#!/usr/bin/env bash
# LoRA training speed and memory: kiln train against PyTorch + PEFT (bench/train_torch.py) on
# the starter model, the same config (rank 8, all seven projections, one 512-token sequence,
# AdamW, lr 2e-4), alternating rounds. Prints one line per run; docs/benchmarks.md has results.
#
#   bench/train_compare.sh [ROUNDS=2] [THREADS=2] [STEPS=6]
#   TORCH_PY=/path/to/python-with-torch-peft-transformers-gguf (default /tmp/torchenv/bin/python)
#   DENSE=1 also runs kiln with the base dequantized at load (dense_base)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-2}"; THREADS="${2:-2}"; STEPS="${3:-6}"
TORCH_PY="${TORCH_PY:-/tmp/torchenv/bin/python}"
MODEL="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
cargo build --release --quiet -p kiln
KILN=target/release/kiln
"$KILN" pull --quiet >/dev/null
WORK="$(mktemp -d /tmp/kiln-train-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
# One long text row: truncated to exactly 512 tokens, every position a target (as the anchor's
# full-sequence loss); what the tokens say does not change the time.
python3 - "$WORK/data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
words = "kiln fires clay pots at dawn while the potter reads about llamas and quantized weights".split()
text = " ".join(random.choice(words) + str(random.randrange(1000)) for _ in range(1200))
open(sys.argv[1], "w").write(json.dumps({"text": text}) + "\n")
PY
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(grep -o 'avx512_vnni\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')level ${KILN_CPU_LEVEL:-native}; commit $(git rev-parse --short HEAD)"
kiln_run() {
  local tag="$1" extra="$2"
  local out="$WORK/adapter-$tag-$RANDOM"
  echo "{\"steps_per_report\": 1, \"weight_decay\": 0.01$extra}" > "$WORK/cfg.json"
  "$KILN" train "$WORK/data.jsonl" --model "$MODEL" --out "$out" --iters $((STEPS + 2)) \
    --max-seq-length 512 --learning-rate 2e-4 --rank 8 --scale 2 --config "$WORK/cfg.json" \
    -t "$THREADS" --json > "$WORK/report.json" 2>/dev/null
  python3 - "$out/metrics.jsonl" "$WORK/report.json" "$tag" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
rep = json.load(open(sys.argv[2]))
tps = [r["tokens_per_sec"] for r in rows[2:]]  # the first two steps are warmup, as the anchor's
print(json.dumps({"run": sys.argv[3], "tokens_per_sec": round(statistics.median(tps), 1),
                  "best": round(max(tps), 1), "peak_rss_mib": round(rep["peak_rss_bytes"] / 2**20, 1)}))
PY
}
for r in $(seq "$ROUNDS"); do
  echo "round $r: load $(cut -d' ' -f1 /proc/loadavg)"
  kiln_run kiln ""
  [[ "${DENSE:-0}" == 1 ]] && kiln_run kiln-dense ", \"dense_base\": true"
  "$TORCH_PY" bench/train_torch.py --gguf "$MODEL" --threads "$THREADS" --steps "$STEPS" --warmup 2 \
    | python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(json.dumps({"run":"torch","tokens_per_sec":d["tokens_per_sec"],"best":round(512/min(d["step_s"]),1),"peak_rss_mib":d["peak_rss_mib"],"torch":d["torch"]}))'
done
