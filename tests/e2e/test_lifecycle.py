"""Startup, SIGTERM drain, sampling determinism."""

import threading
import time

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from conftest import Server


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
    kw = dict(model="x", messages=[{"role": "user", "content": "Invent a word."}], temperature=1.0,
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
