#!/usr/bin/env python3
"""HTTP overhead of `kiln serve` against the direct engine (`kiln generate`), one run.

Measures, for the same greedy completion: time to first token and decode tok/s, directly and
over HTTP (streamed, timed at the client), and the server's startup-to-ready time. The prompt
cache is disabled on the server so both sides prefill the whole prompt.

Usage: .venv/bin/python scripts/bench_http.py [--bin target/release/kiln] [--model smollm2]
"""

import argparse
import json
import re
import statistics
import subprocess
import time

try:
    import httpx2 as httpx
except ImportError:
    import httpx

PROMPT = "The history of the printing press begins"


def direct(bin_, model, n):
    out = subprocess.run([bin_, "generate", model, PROMPT, "--temperature", "0", "--max-tokens", str(n),
                          "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
    s = json.loads(out.stdout)["stats"]
    return s["time_to_first_token_secs"], s["decode_tokens_per_sec"], s["generated_tokens"]


def served(url, n):
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": n, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    pieces = 0
    usage = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.perf_counter()
                first = first or now
                last = now
                pieces += 1
    toks = usage["completion_tokens"]
    return first - t0, (toks - 1) / (last - first), toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/kiln")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    d = [direct(a.bin, a.model, a.tokens) for _ in range(a.runs)]
    t0 = time.perf_counter()
    proc = subprocess.Popen([a.bin, "serve", a.model, "--port", "0", "--prompt-cache-bytes", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        while url is None:
            m = re.match(r"listening on (http://\S+)", proc.stdout.readline())
            url = m and m.group(1)
        while httpx.get(url + "/ready").status_code != 200:
            time.sleep(0.01)
        ready = time.perf_counter() - t0
        served(url, 8)  # warm-up
        s = [served(url, a.tokens) for _ in range(a.runs)]
    finally:
        proc.terminate()
        proc.wait(30)

    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    dt, dr = med(d, 0), med(d, 1)
    st, sr = med(s, 0), med(s, 1)
    print(json.dumps({
        "tokens": a.tokens, "runs": a.runs,
        "direct": {"ttft_s": round(dt, 4), "decode_tok_s": round(dr, 2)},
        "served": {"ttft_s": round(st, 4), "decode_tok_s": round(sr, 2)},
        "overhead": {"decode_pct": round(100 * (dr - sr) / dr, 2), "ttft_ms": round(1000 * (st - dt), 2)},
        "startup_to_ready_s": round(ready, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
