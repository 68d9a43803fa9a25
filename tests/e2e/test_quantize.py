"""The quantize job through the real server: bad configs are refused with a 400 naming the
field, a uniform job runs under the lease and streams its stages, its GGUF loads in kiln, and
a mixed job cancelled mid-sensitivity ends cancelled with no output left."""

import json
import os
import tempfile
import time

import pytest

from conftest import KILN, Server, httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(os.path.dirname(ROOT), "shared", "reference", "tiny", "llama")


@pytest.fixture(scope="module")
def dirs():
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-quant-") as d:
        data, out = os.path.join(d, "data"), os.path.join(d, "out")
        os.makedirs(out)
        yield data, out


@pytest.fixture(scope="module")
def qserver(dirs):
    s = Server(env={"KILN_DATA_DIR": dirs[0]})
    yield s
    assert s.stop() == 0


def post(url, config):
    return httpx.post(url + "/api/jobs", json={"kind": "quantize", "config": config}, timeout=30)


def events_of(url, job_id):
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=600) as r:
        body = "".join(r.iter_text())
    return [json.loads(l[5:]) for l in body.splitlines() if l.startswith("data:") and l[5:].strip().startswith("{")]


def job_of(url, job_id):
    return httpx.get(f"{url}/api/jobs/{job_id}", timeout=10).json()["job"]


def test_bad_configs_name_the_field_and_create_no_row(qserver, dirs):
    url, out = qserver.url, dirs[1]
    before = len(httpx.get(url + "/api/jobs?limit=1000", timeout=10).json()["jobs"])
    cases = [
        ({"model_id": TINY, "bits": 7, "out_dir": out + "/a"}, "bits"),
        ({"model_id": TINY, "group_size": 48, "format": "mlx", "out_dir": out + "/b"}, "group_size"),
        ({"model_id": "/no/such/model", "out_dir": out + "/c"}, "model_id"),
        ({"model_id": TINY, "format": "mlx", "out_dir": "/proc/kiln-cannot-write/x"}, "out_dir"),
        ({"model_id": TINY, "target_bpw": 40}, "target_bpw"),
        ({"model_id": TINY, "candidate_bits": [4, 7]}, "candidate_bits"),
        ({"model_id": TINY, "bitz": 4}, "bitz"),
        ({"model_id": "smollm2", "target_bpw": 2, "candidate_bits": [4, 8]}, "below the smallest"),
    ]
    for config, field in cases:
        r = post(url, config)
        assert r.status_code == 400, (config, r.text)
        assert field in r.json()["error"], (field, r.text)
    after = len(httpx.get(url + "/api/jobs?limit=1000", timeout=10).json()["jobs"])
    assert after == before


def test_uniform_job_streams_stages_and_its_output_loads(qserver, dirs):
    url = qserver.url
    target = os.path.join(dirs[1], "smol-q8.gguf")
    r = post(url, {"model_id": "smollm2", "gguf_type": "Q8_0", "evaluate": True, "out_dir": target})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    events = events_of(url, job_id)
    stages = [e.get("stage") for e in events if e.get("type") == "stage"]
    assert stages[0] == "starting" and "writing" in stages, stages
    done = [e for e in events if e.get("type") == "done"]
    assert done and done[0]["output_dir"] == target, events[-3:]
    assert stages.index("evaluating") > stages.index("writing"), stages
    evals = [e for e in events if e.get("type") == "metric" and e.get("kind") == "eval"]
    # Q8_0 of a Q4_1 source: almost the same distributions.
    assert len(evals) == 1 and 0 <= evals[0]["mean_kl"] < 0.05 and evals[0]["top1_agreement"] > 0.9, evals
    assert done[0]["summary"]["eval"]["top1_agreement"] == evals[0]["top1_agreement"], done[0]
    job = job_of(url, job_id)
    assert job["status"] == "done" and job["output_path"] == target
    assert os.path.getsize(target) > 100_000_000
    gen = os.popen(f"{KILN} generate {target} 'The capital of France is' --max-tokens 4 --temperature 0").read()
    assert "Paris" in gen, gen


def test_mixed_job_cancelled_mid_sensitivity_leaves_nothing(qserver, dirs):
    url = qserver.url
    target = os.path.join(dirs[1], "smol-mixed.gguf")
    r = post(url, {"model_id": "smollm2", "target_bpw": 5.0, "n_calibration": 1, "out_dir": target})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    deadline = time.time() + 120
    while time.time() < deadline:
        job = job_of(url, job_id)
        if job["status"] == "running" and job["progress"] >= 0.05:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"never reached sensitivity: {job}")
    r = httpx.post(f"{url}/api/jobs/{job_id}/cancel", timeout=10)
    assert r.status_code == 200, r.text
    deadline = time.time() + 30
    while job_of(url, job_id)["status"] not in ("cancelled", "failed", "done"):
        assert time.time() < deadline
        time.sleep(0.1)
    assert job_of(url, job_id)["status"] == "cancelled"
    left = [n for n in os.listdir(dirs[1]) if "smol-mixed" in n]
    assert left == [], left



def test_mixed_job_streams_per_module_sensitivity_then_cancels(qserver, dirs):
    url = qserver.url
    target = os.path.join(dirs[1], "smol-mixed-metrics.gguf")
    r = post(url, {"model_id": "smollm2", "target_bpw": 5.5, "candidate_bits": [4, 8], "n_calibration": 1,
                   "out_dir": target})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    first = None
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:") and '"sensitivity"' in line and '"metric"' in line:
                first = json.loads(line[5:])
                break
    assert first and first["index"] == 1 and first["total"] > 100, first
    assert set(first["kl"]) == {"4", "8"} and first["module"].startswith("model."), first
    assert first["kl"]["8"] <= first["kl"]["4"] + 1e-3
    assert httpx.post(f"{url}/api/jobs/{job_id}/cancel", timeout=10).status_code == 200
