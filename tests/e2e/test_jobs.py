"""The job system through the real server: jobs run beside chat, the lease shows in /stats,
exclusive policy gates generations, a crash never takes the server down, and rows survive a
server killed with SIGKILL."""

import json
import os
import signal
import tempfile
import time

import pytest

from conftest import Server, httpx


@pytest.fixture(scope="module")
def data_dir():
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-jobs-") as d:
        yield d


@pytest.fixture(scope="module")
def jobs_server(data_dir):
    s = Server(env={"KILN_DATA_DIR": data_dir})
    yield s
    assert s.stop() == 0


def submit(url, kind, config=None):
    r = httpx.post(url + "/api/jobs", json={"kind": kind, "config": config or {}}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["job_id"]


def wait_terminal(url, job_id, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = httpx.get(f"{url}/api/jobs/{job_id}", timeout=10).json()["job"]
        if job["status"] in ("done", "failed", "cancelled", "zombie"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not finish")


def chat(url, text="Hi"):
    return httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0},
        timeout=60,
    )


def test_crash_fails_and_chat_keeps_working(jobs_server):
    job = wait_terminal(jobs_server.url, submit(jobs_server.url, "crash"))
    assert job["status"] == "failed"
    assert "exited 1" in (job["error"] or "")
    r = chat(jobs_server.url)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"]


def test_lease_holder_in_stats_and_exclusive_gate(jobs_server):
    url = jobs_server.url
    job_id = submit(url, "noop", {"delay_ms": 1500})
    deadline = time.time() + 10
    holder = None
    while time.time() < deadline and holder != job_id:
        holder = httpx.get(url + "/stats", timeout=10).json()["jobs"]["lease_holder"]
        time.sleep(0.05)
    assert holder == job_id, "the running heavy job holds the lease in /stats"
    r = chat(url)
    assert r.status_code == 200
    assert job_id in r.headers.get("x-kiln-job-gate", ""), "the response says it waited for the job"
    job = wait_terminal(url, job_id)
    assert job["status"] == "done" and job["progress"] == 1
    stats = httpx.get(url + "/stats", timeout=10).json()["jobs"]
    assert stats["lease_holder"] is None and stats["policy"] == "exclusive"


def test_sse_replays_a_finished_job_and_ends(jobs_server):
    url = jobs_server.url
    job_id = submit(url, "noop")
    wait_terminal(url, job_id)
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=30) as r:
        body = "".join(r.iter_text())
    events = [json.loads(l[5:]) for l in body.splitlines() if l.startswith("data:") and l[5:].strip().startswith("{")]
    kinds = [e.get("type") or e.get("event") for e in events]
    assert "started" in kinds and "done" in kinds, kinds
    assert "event: end" in body


def test_bad_submits_get_400_and_no_row(jobs_server):
    url = jobs_server.url
    before = len(httpx.get(url + "/api/jobs?limit=1000", timeout=10).json()["jobs"])
    for body in ({"kind": "nope", "config": {}}, {"kind": "noop", "config": [1]}):
        r = httpx.post(url + "/api/jobs", json=body, timeout=10)
        assert r.status_code == 400, r.text
    r = httpx.post(url + "/api/jobs", content=b"{not json", headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400
    after = len(httpx.get(url + "/api/jobs?limit=1000", timeout=10).json()["jobs"])
    assert after == before


def test_server_sigkill_mid_job_never_loses_the_row():
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-kill-") as d:
        s = Server(env={"KILN_DATA_DIR": d})
        try:
            job_id = submit(s.url, "noop", {"delay_ms": 3000})
            time.sleep(0.8)
        finally:
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait(timeout=10)
        s2 = Server(env={"KILN_DATA_DIR": d})
        try:
            job = wait_terminal(s2.url, job_id, timeout=20)
            assert job["status"] in ("zombie", "done"), job
        finally:
            assert s2.stop() == 0
