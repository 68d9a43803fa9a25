#!/usr/bin/env python3
"""Embedding throughput against an OpenAI-compatible `/v1/embeddings` (kiln serve, llama-server).

Every input is exactly TOKENS tokens for a BERT WordPiece vocabulary whose single letters are
pieces (the synthetic files of bench/synth_bert.py, which copy the test fixture's vocabulary):
TOKENS - 2 letters separated by spaces, plus [CLS] and [SEP]. The server's usage is checked
against that count, so both servers provably embed the same number of tokens.

    embed_load.py URL --clients 4 --batch 16 --requests 4 --tokens 128 [--json]

Prints inputs/s and tokens/s over the wall time of all requests (after one warm-up request).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
import threading
import urllib.request


def text(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(string.ascii_lowercase) for _ in range(tokens - 2))


def post(url: str, inputs: list[str]) -> dict:
    # No `model`: each server embeds with the model it was started with.
    body = json.dumps({"input": inputs, "encoding_format": "float"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="inputs per request")
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--tokens", type=int, default=128, help="tokens per input, [CLS] and [SEP] included")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rng = random.Random(0)
    batches = [[text(rng, a.tokens) for _ in range(a.batch)] for _ in range(a.clients * a.requests)]
    warm = post(a.url, batches[0][:2])
    per_input = warm["usage"]["prompt_tokens"] / 2
    if per_input != a.tokens:
        sys.exit(f"embed_load.py: the server counts {per_input} tokens per input, not {a.tokens}")

    failures = []

    def client(c: int) -> None:
        try:
            for r in range(a.requests):
                out = post(a.url, batches[c * a.requests + r])
                assert len(out["data"]) == a.batch
        except Exception as e:  # noqa: BLE001 - reported below, the run fails
            failures.append(repr(e))

    # Threads, not concurrent.futures: bench/concurrent.py beside this file shadows that package.
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        sys.exit(f"embed_load.py: {len(failures)} clients failed: {failures[0]}")
    inputs = a.clients * a.requests * a.batch
    res = {"clients": a.clients, "batch": a.batch, "tokens": a.tokens, "inputs": inputs,
           "wall_s": round(wall, 3), "inputs_per_s": round(inputs / wall, 2),
           "tokens_per_s": round(inputs * a.tokens / wall, 1)}
    print(json.dumps(res) if a.json else
          f"{inputs} inputs of {a.tokens} tokens in {wall:.2f} s: {inputs / wall:.2f} inputs/s, "
          f"{inputs * a.tokens / wall:.0f} tokens/s")


if __name__ == "__main__":
    main()
