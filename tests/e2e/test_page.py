"""The chat page in Debian's headless Chromium, driven by playwright-core (no browser download)."""

import json
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "page", "chat_page.mjs")
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium")
HAVE_DRIVER = os.path.isdir(os.path.join(HERE, "page", "node_modules", "playwright-core"))


@pytest.mark.skipif(not (CHROMIUM and shutil.which("node") and HAVE_DRIVER),
                    reason="needs chromium, node and playwright-core (scripts/e2e.sh installs it)")
def test_chat_page_streams_an_answer(server):
    out = subprocess.run(["node", SCRIPT, server.url + "/?temperature=0&max_tokens=64"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CHROMIUM": CHROMIUM})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["model"] and r["model"] != "unavailable"
    assert r["model"] in r["options"] and r["answeredBy"] == r["model"]
    assert "f16" in r["kv"]
    assert r["answer"].strip()
    assert r["updates"] >= 3, "the answer did not stream"
    assert "tok/s" in r["speed"]
    assert r["stopSecs"] < 3 and r["sendEnabled"]
    assert not r["consoleErrors"]
