#!/usr/bin/env bash
# Measures kiln against llama.cpp on the same GGUF and thread counts, in the
# same run, and prints a markdown table: min/median/max tokens per second for
# each engine and the kiln/llama.cpp ratio of the medians.
#
# The two engines run alternately (kiln, llama.cpp, kiln, llama.cpp, ... for
# ROUNDS rounds and each thread count) so that noise from the rest of the
# machine falls on both. Every repetition of every round is one sample.
#
# Usage: bench/compare.sh [options]        (bench/compare.sh -h for the list)
# See docs/benchmarks.md for how to build llama-bench.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The command line as typed, with the settings that came from the environment.
shell_word() {
    if [[ "$1" =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then printf '%s' "$1"
    else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
CMDLINE=""
for v in KILN_CPU_LEVEL KILN_BIN LLAMA_BENCH MODEL ROUNDS THREADS REPS PP TG DEPTH KV_DTYPE; do
    if [[ -n "${!v:-}" ]]; then CMDLINE+="$v=$(shell_word "${!v}") "; fi
done
CMDLINE+="$(shell_word "$0")"
for a in "$@"; do CMDLINE+=" $(shell_word "$a")"; done

usage() {
    cat <<EOF
usage: bench/compare.sh [options]

Options (each also settable through the environment variable in brackets):
  -m, --model PATH      GGUF file to measure [MODEL]
                        (default: the starter model, from \`kiln pull --quiet\`)
  -r, --rounds N        alternating rounds [ROUNDS] (default 3)
  -t, --threads LIST    thread counts, space- or comma-separated [THREADS]
                        (default "1 2")
      --reps N          repetitions inside each engine run [REPS] (default 3)
  -p, --prompt N        prompt tokens of the prefill test ppN [PP] (default 512)
  -n, --gen N           tokens of the generation test tgN [TG] (default 128)
  -d, --depth N         cache positions filled before each test, llama-bench's
                        -d [DEPTH] (default 0)
      --kv-dtype T      KV-cache storage for both engines: f32, f16 or bf16
                        (kiln --kv-quant off --kv-dtype, llama-bench -ctk/-ctv)
                        [KV_DTYPE]
                        (default: each engine's own, f16 for both)
      --kiln PATH       kiln binary [KILN_BIN] (default target/release/kiln)
      --llama-bench PATH
                        llama-bench binary [LLAMA_BENCH]
                        (default /opt/llama.cpp/bin/llama-bench)
  -o, --output FILE     also write the markdown report to FILE
      --raw DIR         keep every run's JSON output and stderr in DIR
  -h, --help            this text

Samples per cell: ROUNDS x REPS. Progress goes to stderr, the report to stdout.
EOF
}

KILN_BIN="${KILN_BIN:-$ROOT/target/release/kiln}"
LLAMA_BENCH="${LLAMA_BENCH:-/opt/llama.cpp/bin/llama-bench}"
MODEL="${MODEL:-}"
ROUNDS="${ROUNDS:-3}"
THREADS="${THREADS:-1 2}"
REPS="${REPS:-3}"
PP="${PP:-512}"
TG="${TG:-128}"
DEPTH="${DEPTH:-0}"
KV_DTYPE="${KV_DTYPE:-}"
OUTPUT=""
RAW_DIR=""

need_arg() { [[ $# -ge 2 && -n "$2" ]] || { echo "compare.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -m|--model)       need_arg "$@"; MODEL="$2"; shift 2 ;;
        -r|--rounds)      need_arg "$@"; ROUNDS="$2"; shift 2 ;;
        -t|--threads)     need_arg "$@"; THREADS="$2"; shift 2 ;;
        --reps)           need_arg "$@"; REPS="$2"; shift 2 ;;
        -p|--prompt)      need_arg "$@"; PP="$2"; shift 2 ;;
        -n|--gen)         need_arg "$@"; TG="$2"; shift 2 ;;
        -d|--depth)       need_arg "$@"; DEPTH="$2"; shift 2 ;;
        --kv-dtype)       need_arg "$@"; KV_DTYPE="$2"; shift 2 ;;
        --kiln)           need_arg "$@"; KILN_BIN="$2"; shift 2 ;;
        --llama-bench)    need_arg "$@"; LLAMA_BENCH="$2"; shift 2 ;;
        -o|--output)      need_arg "$@"; OUTPUT="$2"; shift 2 ;;
        --raw)            need_arg "$@"; RAW_DIR="$2"; shift 2 ;;
        -h|--help)        usage; exit 0 ;;
        *) echo "compare.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

die() { echo "compare.sh: $*" >&2; exit 1; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

THREADS="${THREADS//,/ }"
read -r -a THREAD_LIST <<<"$THREADS"
[[ ${#THREAD_LIST[@]} -gt 0 ]] || die "THREADS is empty"
for t in "${THREAD_LIST[@]}"; do
    is_uint "$t" && [[ "$t" -gt 0 ]] || die "bad thread count: $t"
done
for v in ROUNDS REPS; do
    is_uint "${!v}" && [[ "${!v}" -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
done
for v in PP TG DEPTH; do
    is_uint "${!v}" || die "$v must be a non-negative integer (got '${!v}')"
done
[[ "$PP" -gt 0 || "$TG" -gt 0 ]] || die "PP and TG are both 0: nothing to measure"
# Leading zeros would make the test names differ between the engines ("d0100" vs "d100").
PP=$((10#$PP)); TG=$((10#$TG)); DEPTH=$((10#$DEPTH))
# Flags only where asked, so an older llama-bench without -d / -ctk still runs the defaults.
DEPTH_ARGS=()
if [[ "$DEPTH" -gt 0 ]]; then DEPTH_ARGS=(-d "$DEPTH"); fi
KILN_KV=()
LLAMA_KV=()
case "$KV_DTYPE" in
    "") ;;
    # --kv-quant off: a dense cache even for a model that ships a kv_config.json.
    f32|f16|bf16) KILN_KV=(--kv-quant off --kv-dtype "$KV_DTYPE"); LLAMA_KV=(-ctk "$KV_DTYPE" -ctv "$KV_DTYPE") ;;
    *) die "KV_DTYPE must be f32, f16 or bf16 (got '$KV_DTYPE')" ;;
esac

# A relative binary path is taken from the current directory, else the repo root.
resolve_bin() {
    local p="$1"
    if [[ "$p" != /* && ! -e "$p" && -e "$ROOT/$p" ]]; then p="$ROOT/$p"; fi
    echo "$p"
}
KILN_BIN="$(resolve_bin "$KILN_BIN")"
LLAMA_BENCH="$(resolve_bin "$LLAMA_BENCH")"
[[ -x "$KILN_BIN" ]] || die "kiln binary not found at '$KILN_BIN' (cargo build --release -p kiln, or set KILN_BIN)"
[[ -x "$LLAMA_BENCH" ]] || die "llama-bench not found at '$LLAMA_BENCH' (see docs/benchmarks.md, or set LLAMA_BENCH)"
command -v python3 >/dev/null || die "python3 is needed to read the JSON output"

if [[ -z "$MODEL" ]]; then
    echo "compare.sh: no MODEL given; asking kiln for the starter model" >&2
    MODEL="$("$KILN_BIN" pull --quiet | tail -n 1)" || die "kiln pull --quiet failed"
fi
[[ -f "$MODEL" ]] || die "model file not found: '$MODEL'"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kiln-compare.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
if [[ -n "$RAW_DIR" ]]; then mkdir -p "$RAW_DIR"; fi

# ---- provenance ---------------------------------------------------------
GIT_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ "$GIT_COMMIT" != unknown && -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    GIT_COMMIT="$GIT_COMMIT (uncommitted changes)"
fi
CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
# VMs often name only the vendor ("AMD EPYC"); family and model tell the core generation
# (AMD family 23 model 1 is Zen 1, model 49 Zen 2; family 25 model 1 Zen 3, 17 Zen 4).
CPU_FM="$(lscpu 2>/dev/null | awk -F: '/^CPU family:/ {gsub(/ /, "", $2); f = $2}
    /^Model:/ {gsub(/ /, "", $2); m = $2} END {if (f != "") printf "family %s model %s", f, m}')"
CPU_MODEL="${CPU_MODEL:-unknown} (${CPU_FM:+$CPU_FM, }$(nproc 2>/dev/null || echo '?') logical CPUs)"
# The instruction-set flags the kernels of both engines choose by, and kiln's forced level.
CPU_FLAGS="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' \
    | grep -E '^(avx|avx2|fma|f16c|avx_vnni|avx512(f|bw|vl|dq|_vnni|_bf16|vnni|bf16|_fp16)|amx_[a-z0-9]+)$' \
    | paste -sd ' ' - || true)"
CPU_FLAGS="${CPU_FLAGS:-unknown}; kiln level: ${KILN_CPU_LEVEL:-native}"
KILN_VERSION="$("$KILN_BIN" --version 2>/dev/null | head -n 1 || true)"
# llama-bench --version prints "version: N (commit)" and "built with ..." to stderr.
LLAMA_VERSION="$("$LLAMA_BENCH" --version 2>&1 | grep -E '^(version|built with)' | paste -sd ';' - | sed 's/;/; /' || true)"
# A SOURCE file beside bin/ (docs/benchmarks.md) says where the build came from.
LLAMA_SOURCE=""
if [[ -f "$(dirname "$LLAMA_BENCH")/../SOURCE" ]]; then
    LLAMA_SOURCE="$(head -n 1 "$(dirname "$LLAMA_BENCH")/../SOURCE")"
fi
DATE="$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'; }
LOAD_START="$(loadavg)"

# ---- the alternating runs -----------------------------------------------
run_logged() { # out_json err_log cmd...
    local out="$1" err="$2"; shift 2
    if ! "$@" >"$out" 2>"$err"; then
        echo "compare.sh: failed: $*" >&2
        tail -n 20 "$err" >&2
        exit 1
    fi
}

for ((round = 1; round <= ROUNDS; round++)); do
    for t in "${THREAD_LIST[@]}"; do
        tag="r${round}_t${t}"
        echo "compare.sh: round $round/$ROUNDS, $t thread(s): kiln" >&2
        run_logged "$WORK/kiln_$tag.json" "$WORK/kiln_$tag.log" \
            "$KILN_BIN" bench "$MODEL" -p "$PP" -n "$TG" -r "$REPS" --threads "$t" \
            ${DEPTH_ARGS[@]+"${DEPTH_ARGS[@]}"} ${KILN_KV[@]+"${KILN_KV[@]}"} --json
        echo "compare.sh: round $round/$ROUNDS, $t thread(s): llama.cpp" >&2
        run_logged "$WORK/llama_$tag.json" "$WORK/llama_$tag.log" \
            "$LLAMA_BENCH" -m "$MODEL" -p "$PP" -n "$TG" -r "$REPS" -t "$t" \
            ${DEPTH_ARGS[@]+"${DEPTH_ARGS[@]}"} ${LLAMA_KV[@]+"${LLAMA_KV[@]}"} -o json
    done
done
LOAD_END="$(loadavg)"
if [[ -n "$RAW_DIR" ]]; then cp "$WORK"/*.json "$WORK"/*.log "$RAW_DIR"/; fi

# ---- the report -----------------------------------------------------------
report() {
    python3 - "$WORK" <<'PY'
import glob, json, os, re, statistics, sys

work = sys.argv[1]
env = os.environ

def load(path):
    text = open(path).read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Tolerate stray lines before the JSON array.
        start = text.find("[")
        if start < 0:
            raise SystemExit(f"compare.sh: no JSON in {path}")
        return json.loads(text[start:])

samples = {}  # (engine, threads, test) -> [tok/s]
def add(engine, threads, test, values):
    samples.setdefault((engine, int(threads), test), []).extend(float(v) for v in values)

llama_build = set()
kv_seen = {"kiln": set(), "llama.cpp": set()}
for path in sorted(glob.glob(os.path.join(work, "kiln_*.json"))):
    for row in load(path):
        add("kiln", row["threads"], row["test"], row["samples"])
        kv_seen["kiln"].add(row.get("kv_scheme", "?"))
for path in sorted(glob.glob(os.path.join(work, "llama_*.json"))):
    for row in load(path):
        n_prompt, n_gen = int(row.get("n_prompt", 0)), int(row.get("n_gen", 0))
        depth = int(row.get("n_depth", 0) or 0)
        if n_prompt > 0 and n_gen == 0:
            test = f"pp{n_prompt}"
        elif n_gen > 0 and n_prompt == 0:
            test = f"tg{n_gen}"
        else:
            test = f"pp{n_prompt}+tg{n_gen}"
        if depth:
            test += f" @ d{depth}"
        add("llama.cpp", row["n_threads"], test, row["samples_ts"])
        kv_seen["llama.cpp"].add(f'{row.get("type_k", "?")}/{row.get("type_v", "?")}')
        llama_build.add(f'{row.get("build_commit", "?")} ({row.get("build_number", "?")})')

tests = []
at = f' @ d{env["DEPTH"]}' if int(env["DEPTH"]) > 0 else ""
if int(env["PP"]) > 0: tests.append(f'pp{env["PP"]}{at}')
if int(env["TG"]) > 0: tests.append(f'tg{env["TG"]}{at}')
threads = [int(t) for t in env["THREADS"].split()]

def stats(key):
    v = samples.get(key)
    if not v:
        return None
    return min(v), statistics.median(v), max(v), len(v)

def fmt(x):
    return "-" if x is None else f"{x:.2f}"

out = []
out.append(f'Model: `{os.path.basename(env["MODEL"])}` ({os.path.getsize(env["MODEL"]) / 2**20:.1f} MiB)  ')
out.append(f'Command: `{env["CMDLINE"]}`  ')
out.append(f'Date: {env["DATE"]}  ')
out.append(f'kiln: commit {env["GIT_COMMIT"]}; `{env["KILN_VERSION"] or "?"}`  ')
lv = env["LLAMA_VERSION"] or "?"
builds = [b for b in sorted(llama_build) if b.split()[0] not in lv]
out.append(f'llama.cpp: {lv}' + (f' (llama-bench JSON: build_commit {", ".join(builds)})' if builds else "") + "  ")
if env.get("LLAMA_SOURCE"):
    out.append(f'llama.cpp source: {env["LLAMA_SOURCE"]}  ')
out.append(f'CPU: {env["CPU_MODEL"]}  ')
out.append(f'CPU flags: {env["CPU_FLAGS"]}  ')
out.append(f'Binaries: `{env["KILN_BIN"]}`, `{env["LLAMA_BENCH"]}`  ')
out.append(f'Runs: {env["ROUNDS"]} alternating round(s) x {env["REPS"]} repetition(s) per engine run; '
           f'threads {", ".join(map(str, threads))}; KV cache (as the engines report it): '
           f'kiln {", ".join(sorted(kv_seen["kiln"]))}, llama.cpp K/V '
           f'{", ".join(sorted(kv_seen["llama.cpp"]))}  ')
out.append(f'Load average (1/5/15 min): {env["LOAD_START"]} before the runs (well above 0: other work '
           f'is using the cores), {env["LOAD_END"]} after (counts the benchmark\'s own threads)')
out.append("")
out.append("tokens/second; min / median / max over all samples")
out.append("")
out.append("| test | threads | kiln min | kiln median | kiln max | llama.cpp min | llama.cpp median | llama.cpp max | kiln / llama.cpp |")
out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
missing = []
for test in tests:
    for t in threads:
        k = stats(("kiln", t, test))
        l = stats(("llama.cpp", t, test))
        if k is None: missing.append(f"kiln {test} t={t}")
        if l is None: missing.append(f"llama.cpp {test} t={t}")
        ratio = f"{k[1] / l[1]:.2f}x" if k and l and l[1] > 0 else "-"
        out.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            test, t,
            fmt(k and k[0]), fmt(k and k[1]), fmt(k and k[2]),
            fmt(l and l[0]), fmt(l and l[1]), fmt(l and l[2]), ratio))
print("\n".join(out))
if missing:
    print("compare.sh: no samples for: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
PY
}

export KILN_BIN LLAMA_BENCH MODEL ROUNDS REPS PP TG DEPTH KV_DTYPE CMDLINE DATE GIT_COMMIT KILN_VERSION LLAMA_VERSION LLAMA_SOURCE CPU_MODEL CPU_FLAGS LOAD_START LOAD_END
export THREADS="${THREAD_LIST[*]}"
if [[ -n "$OUTPUT" ]]; then
    report | tee "$OUTPUT"
else
    report
fi
