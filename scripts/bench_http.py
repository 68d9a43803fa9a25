#!/usr/bin/env python3
"""HTTP overhead of `kiln serve` against the direct engine (`kiln generate`), and against
llama.cpp's `llama-server` on the same GGUF file, one run.

Measures, for the same greedy completion (EOS ignored): time to first token and decode tok/s,
directly and over HTTP (streamed, timed at the client), and each server's startup-to-ready time.
The prompt caches are disabled so every request prefills the whole prompt.

Usage: .venv/bin/python scripts/bench_http.py [--bin target/release/kiln] [--model smollm2]
           [--llama-server /opt/llama.cpp/bin/llama-server] [--threads 2]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import time

try:
    import httpx2 as httpx
except ImportError:
    import httpx

PROMPT = "The history of the printing press begins"


def direct(bin_, model, n, threads):
    out = subprocess.run([bin_, "generate", model, PROMPT, "--temperature", "0", "--max-tokens", str(n),
                          "--ignore-eos", "--json", "-t", str(threads)], capture_output=True, text=True, check=True)
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
    # llama-server may not report usage on streams; each of its chunks is one token.
    toks = usage["completion_tokens"] if usage else pieces
    return first - t0, (toks - 1) / (last - first), toks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, url_from_stdout=None, url=None):
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if url_from_stdout else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    while url is None:
        m = re.match(r"listening on (http://\S+)", proc.stdout.readline())
        url = m and m.group(1)
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.01)
    return proc, url, time.perf_counter() - t0


def stop(proc):
    proc.terminate()
    proc.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/kiln")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", default="/opt/llama.cpp/bin/llama-server")
    a = ap.parse_args()

    threads = str(a.threads)
    procs = []
    try:
        proc, kurl, kiln_ready = start([a.bin, "serve", a.model, "--port", "0", "--prompt-cache-bytes", "0",
                                        "-t", threads], url_from_stdout=True)
        procs.append(proc)
        # Same GGUF file for llama-server (`kiln pull --quiet` prints its path).
        gguf = subprocess.run([a.bin, "pull", "--quiet"], capture_output=True, text=True).stdout.strip() \
            if a.model == "smollm2" else a.model
        lurl = lready = None
        if os.path.exists(a.llama_server) and gguf.endswith(".gguf"):
            port = free_port()
            proc, lurl, lready = start([a.llama_server, "-m", gguf, "--port", str(port), "-t", threads,
                                        "-c", "4096", "--cache-reuse", "0", "-np", "1"],
                                       url=f"http://127.0.0.1:{port}")
            procs.append(proc)
        for url in filter(None, [kurl, lurl]):
            served(url, 8)  # warm-up
        # Rounds interleave the three, so machine noise falls on all of them alike.
        d, s, l = [], [], []
        for _ in range(a.runs):
            d.append(direct(a.bin, a.model, a.tokens, a.threads))
            s.append(served(kurl, a.tokens))
            if lurl:
                l.append(served(lurl, a.tokens))
    finally:
        for p in procs:
            stop(p)

    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    dt, dr = med(d, 0), med(d, 1)
    st, sr = med(s, 0), med(s, 1)
    report = {
        "tokens": a.tokens, "runs": a.runs, "threads": a.threads,
        "direct": {"ttft_s": round(dt, 4), "decode_tok_s": round(dr, 2)},
        "served": {"ttft_s": round(st, 4), "decode_tok_s": round(sr, 2), "startup_to_ready_s": round(kiln_ready, 3)},
        "http_overhead": {"decode_pct": round(100 * (dr - sr) / dr, 2), "ttft_ms": round(1000 * (st - dt), 2)},
    }
    if l:
        lt, lr = med(l, 0), med(l, 1)
        report["llama_server"] = {"ttft_s": round(lt, 4), "decode_tok_s": round(lr, 2),
                                  "startup_to_ready_s": round(lready, 3)}
        report["kiln_vs_llama_server"] = {"decode_ratio": round(sr / lr, 3), "ttft_ratio": round(st / lt, 3)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
