"""Startup, SIGTERM drain, sampling determinism."""

import socket
import threading
import time

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from conftest import MODEL, Server


def test_sigterm_drains_in_flight_stream():
    s = Server()
    lines = []

    def stream():
        body = {"messages": [{"role": "user", "content": "Tell a story."}], "stream": True,
                "max_tokens": 40, "temperature": 0}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines.extend(r.iter_lines())

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.4)  # mid-stream
    code = s.stop()
    t.join(30)
    assert code == 0
    assert lines and lines[-1] == "data: [DONE]" or "data: [DONE]" in lines
    assert any('"finish_reason":"length"' in l for l in lines)


def test_seed_reproduces_sampled_output(oai):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a word."}], temperature=1.0,
              max_tokens=12, seed=1234)
    a = oai.chat.completions.create(**kw).choices[0].message.content
    b = oai.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_bad_flags_fail_fast_with_a_message():
    import subprocess

    from conftest import KILN

    for flags, needle in [(["--temperature=-1"], "--temperature"), (["--top-p", "2"], "--top-p"),
                          (["--queue", "0"], "--queue"), (["--port", "x"], "--port")]:
        out = subprocess.run([KILN, "serve", *flags], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert needle in out.stderr and "panicked" not in out.stderr


def test_idle_and_blank_line_connections_are_closed_within_the_header_timeout():
    s = Server("--header-timeout", "2")
    try:
        host, port = s.url.removeprefix("http://").split(":")
        conns = [socket.create_connection((host, int(port))) for _ in range(10)]
        blank = socket.create_connection((host, int(port)))
        blank.sendall(b"\r\n\r\n\r\n\r\n")
        t0 = time.monotonic()
        for c in conns + [blank]:
            c.settimeout(15)
            assert c.recv(1) == b"", "an idle connection gets a close, nothing else"
        took = time.monotonic() - t0
        assert took < 2 + 4, f"closed after {took:.1f} s"
        # The server still answers, and a stream longer than the timeout is not cut.
        body = {"messages": [{"role": "user", "content": "Count to fifty."}], "stream": True,
                "max_tokens": 800, "ignore_eos": True, "temperature": 0}
        t0 = time.monotonic()
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        # Not cut: it ran to its token budget (some tokens share a chunk while UTF-8 is held back).
        assert '"finish_reason":"length"' in lines[-2], lines[-2]
        assert time.monotonic() - t0 > 2, "the stream outlived the header timeout"
    finally:
        s.stop()
