"""Starts the real `kiln serve` binary on 127.0.0.1:0 and hands out SDK clients."""

import os
import re
import signal
import subprocess
import tempfile
import time

import anthropic
try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN", os.path.join(ROOT, "target", "debug", "kiln"))
MODEL = os.environ.get("KILN_E2E_MODEL", "smollm2")


class Server:
    def __init__(self, *extra, env=None, model=None):
        self.env = env
        self.model = model or MODEL
        try:
            self._start(extra)
        except BaseException:
            if getattr(self, "proc", None) and self.proc.poll() is None:
                self.proc.kill()
            raise

    def _start(self, extra):
        # stderr goes to a file: an unread pipe could fill up and stall the server.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [KILN, "serve", self.model, "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **(self.env or {})},
        )
        deadline = time.time() + 120
        self.url = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.log.seek(0)
                raise RuntimeError("kiln serve exited: " + self.log.read())
            m = re.match(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        assert self.url, "no URL printed"
        r = httpx.get(self.url + "/ready", timeout=30)
        assert r.status_code == 200

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    code = s.stop()
    assert code == 0, "kiln serve did not exit cleanly on SIGTERM"


@pytest.fixture(scope="session")
def keyed_server():
    s = Server("--api-key", "sekrit")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def anth(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
