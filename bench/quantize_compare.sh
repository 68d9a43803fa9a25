#!/usr/bin/env bash
# kiln's quantize against llama-quantize on one source, judged by the same tool.
#
# From a GGUF (default: the starter model) it makes an f16 source with llama-quantize, then:
#   - llama-quantize Q3_K_M and Q4_K_M of that source;
#   - kiln mixed precision at Q3_K_M's stored bits per weight (minus 0.01, so that kiln's
#     extra metadata keeps the file no larger), and kiln uniform Q4_K / Q8_0;
#   - every GGUF scored by `llama-perplexity --kl-divergence` against the f16 source's logits
#     (-c 512 -b 512, the text of ../shared/reference/smollm2/kl_text.txt);
#   - kiln MLX uniform 4-bit g64 and mixed at 4.5 bpw scored by `kiln eval kl`;
#   - llama-server started on kiln's mixed GGUF answers a completion (llama.cpp loads it);
#   - wall time and peak RSS of every quantization (GNU time).
# Prints one line per file; the full logs stay in $WORK.
#
# Environment: KILN_BIN (target/release/kiln), LLAMA_BIN (folder with llama-quantize,
# llama-perplexity, llama-server), SRC (a GGUF), TEXT, WORK (/tmp/kiln-quant-bench),
# N_CAL (kiln --n-calibration, 2), THREADS (2), MLX_PY (a python with mlx-lm: then mlx-lm loads
# both MLX folders and generates).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_BIN=${KILN_BIN:-$ROOT/target/release/kiln}
LLAMA_BIN=${LLAMA_BIN:?set LLAMA_BIN to a folder with llama-quantize, llama-perplexity and llama-server}
SRC=${SRC:-$("$KILN_BIN" pull --quiet)}
TEXT=${TEXT:-$ROOT/../shared/reference/smollm2/kl_text.txt}
WORK=${WORK:-/tmp/kiln-quant-bench}
N_CAL=${N_CAL:-2} THREADS=${THREADS:-2}
mkdir -p "$WORK"
cd "$WORK"
rm -rf kiln-* llama-* f16.gguf base.kld

timed() { # name command...: runs it, appends "name seconds peak_kb" to times.txt
    local name=$1
    shift
    /usr/bin/time -f "$name %e %M" -a -o times.txt "$@" >"$name.log" 2>&1
}

: >times.txt
timed f16 "$LLAMA_BIN/llama-quantize" --allow-requantize "$SRC" f16.gguf F16
for t in Q3_K_M Q4_K_M Q4_K Q8_0; do
    timed "llama-$t" "$LLAMA_BIN/llama-quantize" f16.gguf "llama-$t.gguf" "$t"
done
bpw=$(python3 - <<'PY'
import struct, sys
# Stored bits per weight of the 2-D tensors of llama-Q3_K_M.gguf, from its header.
sys.path.insert(0, "")
from gguf import GGUFReader
r = GGUFReader("llama-Q3_K_M.gguf")
bits = params = 0
for t in r.tensors:
    if len([d for d in t.shape if d > 1]) == 2:
        bits += t.n_bytes * 8
        params += int(t.n_elements)
print(f"{bits / params - 0.01:.4f}")
PY
)
timed kiln-mixed "$KILN_BIN" quantize f16.gguf --out kiln-mixed.gguf --target-bpw "$bpw" \
    --n-calibration "$N_CAL" -t "$THREADS" --json
for t in Q4_K Q8_0; do
    timed "kiln-$t" "$KILN_BIN" quantize f16.gguf --out "kiln-$t.gguf" --type "$t" -t "$THREADS"
done
timed kiln-mlx4g64 "$KILN_BIN" quantize f16.gguf --out kiln-mlx4g64 --format mlx --bits 4 \
    --group-size 64 -t "$THREADS"
timed kiln-mlx-mixed "$KILN_BIN" quantize f16.gguf --out kiln-mlx-mixed --format mlx \
    --group-size 64 --target-bpw 4.5 --n-calibration "$N_CAL" -t "$THREADS" --json

"$LLAMA_BIN/llama-perplexity" -m f16.gguf -f "$TEXT" -c 512 -b 512 -t "$THREADS" \
    --kl-divergence-base base.kld >base.log 2>&1
echo "file bytes mean_kld same_top_p (llama-perplexity --kl-divergence vs f16)"
for f in llama-Q3_K_M llama-Q4_K_M llama-Q4_K llama-Q8_0 kiln-mixed kiln-Q4_K kiln-Q8_0; do
    "$LLAMA_BIN/llama-perplexity" -m "$f.gguf" -f "$TEXT" -c 512 -b 512 -t "$THREADS" \
        --kl-divergence-base base.kld --kl-divergence >"$f.kld.log" 2>&1
    kld=$(grep -E "^Mean +KLD" "$f.kld.log" | awk '{print $3}')
    top=$(grep -E "^Same top p" "$f.kld.log" | awk '{print $4}')
    echo "$f $(stat -c %s "$f.gguf") $kld $top"
done
echo "folder bytes mean_kl top1 (kiln eval kl vs f16)"
for f in kiln-mlx4g64 kiln-mlx-mixed; do
    "$KILN_BIN" eval kl "$f" --reference f16.gguf --text "$TEXT" --json -t "$THREADS" >"$f.kl.json"
    python3 -c "import json,sys; r=json.load(open('$f.kl.json')); print('$f', sum(__import__('os').path.getsize('$f/'+n) for n in __import__('os').listdir('$f')), round(r['mean_kl'],5), round(r['top1_agreement'],4))"
done
echo "name seconds peak_kb"
cat times.txt

"$LLAMA_BIN/llama-server" -m kiln-mixed.gguf --port 18438 -t "$THREADS" >server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:18438/health >/dev/null 2>&1 && break; sleep 0.2; done
echo "llama-server on kiln-mixed.gguf:"
curl -s http://127.0.0.1:18438/completion -d '{"prompt":"The capital of France is","n_predict":8,"temperature":0}' |
    python3 -c "import json,sys; print(repr(json.load(sys.stdin)['content']))"

if [[ -n "${MLX_PY:-}" ]]; then
    echo "mlx-lm on kiln's MLX folders:"
    "$MLX_PY" - <<'PY'
from mlx_lm import generate, load
for d in ["kiln-mlx4g64", "kiln-mlx-mixed"]:
    model, tok = load(d)
    print(d, repr(generate(model, tok, prompt="The capital of France is", max_tokens=8)))
PY
fi
