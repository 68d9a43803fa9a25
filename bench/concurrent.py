#!/usr/bin/env python3
"""Concurrent streaming chat clients against an OpenAI-compatible server.

Each of N clients sends R streaming /v1/chat/completions requests one after another (each a
different short question, greedy, `max_tokens` tokens, EOS ignored so every server generates
the same count) and the script reports, for the whole run: aggregate generated tokens per
second (usage's completion_tokens over wall time), time to first token p50/p90, errors.

Usage: bench/concurrent.py URL CLIENTS [--requests R] [--max-tokens N] [--json]
Standard library only (threads + http.client), so it runs on a bare machine.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Why is the sky blue?",
    "Give me a tip for learning to cook.",
    "What does a compiler do?",
    "Describe a cat in one sentence.",
    "How many legs does a spider have?",
    "What is the boiling point of water?",
]


def one_request(url, question, max_tokens):
    """Returns (ttft seconds, completion tokens) or raises."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({
        "model": "bench",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, tokens, chunks = None, None, 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("error"):
            raise RuntimeError(str(ev["error"]))
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
        if ev.get("usage"):
            tokens = ev["usage"].get("completion_tokens")
    conn.close()
    if ttft is None:
        raise RuntimeError("no content streamed")
    return ttft, tokens if tokens is not None else chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("clients", type=int)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ttfts, tokens, errors = [], [0], []
    lock = threading.Lock()

    def client(i):
        for r in range(a.requests):
            q = QUESTIONS[(i + r) % len(QUESTIONS)] + f" (client {i}, request {r})"
            try:
                t, n = one_request(a.url, q, a.max_tokens)
                with lock:
                    ttfts.append(t)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    q = statistics.quantiles(ttfts, n=10) if len(ttfts) > 1 else [ttfts[0]] * 9 if ttfts else [0] * 9
    out = {
        "clients": a.clients,
        "requests": len(ttfts) + len(errors),
        "errors": len(errors),
        "tokens": tokens[0],
        "wall_s": round(wall, 2),
        "tok_s": round(tokens[0] / wall, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p90_s": round(q[8], 3),
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(out)
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)


if __name__ == "__main__":
    main()
