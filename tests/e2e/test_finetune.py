"""The finetune job through the real server: bad configs are refused with a 400 naming the
field; an SFT job on the test model runs under the lease, streams train and validation
metrics whose loss falls, and writes a PEFT-layout adapter; a stop request saves the adapter
so far and ends the job done."""

import json
import os
import tempfile

import pytest

from conftest import Server, httpx

QUESTIONS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is the capital of Spain?", "The capital of Spain is Madrid."),
    ("How many legs does a dog have?", "A dog has 4 legs."),
    ("What color is grass?", "Grass is green."),
    ("What is 2 plus 3?", "2 plus 3 is 5."),
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("How many legs does a spider have?", "A spider has 8 legs."),
    ("What color is snow?", "Snow is white."),
]


@pytest.fixture(scope="module")
def dirs():
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-ft-") as d:
        data, train = os.path.join(d, "data"), os.path.join(d, "train")
        os.makedirs(train)
        rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "Beep boop! " + a}]} for q, a in QUESTIONS]
        for name, part in (("train.jsonl", rows[2:]), ("valid.jsonl", rows[:2])):
            with open(os.path.join(train, name), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in part)
        yield data, train, d


@pytest.fixture(scope="module")
def fserver(dirs):
    s = Server(env={"KILN_DATA_DIR": dirs[0]})
    yield s
    assert s.stop() == 0


def post(url, config):
    return httpx.post(url + "/api/jobs", json={"kind": "finetune", "config": config}, timeout=30)


def events_of(url, job_id):
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=900) as r:
        body = "".join(r.iter_text())
    events = [json.loads(l[5:]) for l in body.splitlines() if l.startswith("data:") and l[5:].strip().startswith("{")]
    return [e for e in events if e]  # the stream's closing `end` frame carries `{}`


def test_bad_configs_name_the_field(fserver, dirs):
    url, train, root = fserver.url, dirs[1], dirs[2]
    cases = [
        ({"data_dir": train}, "model_dir"),
        ({"model_dir": "smollm2"}, "data_dir"),
        ({"model_dir": "smollm2", "data_dir": root + "/missing"}, "data_dir"),
        ({"model_dir": "/no/such/model", "data_dir": train}, "model_dir"),
        ({"model_dir": "smollm2", "data_dir": train, "rank": 0}, "rank"),
        ({"model_dir": "smollm2", "data_dir": train, "method": "ppo"}, "method"),
        ({"model_dir": "smollm2", "data_dir": train, "grad_checkpoint": True}, "grad_checkpoint"),
        ({"model_dir": "smollm2", "data_dir": train, "no_such": 1}, "no_such"),
    ]
    for config, field in cases:
        r = post(url, config)
        assert r.status_code == 400, (config, r.text)
        assert field in r.json()["error"], (field, r.text)


def test_sft_job_streams_falling_loss_and_writes_a_peft_adapter(fserver, dirs):
    url, train, root = fserver.url, dirs[1], dirs[2]
    out = os.path.join(root, "adapter")
    config = {"model_dir": "smollm2", "data_dir": train, "adapter_path": out, "iters": 12,
              "learning_rate": 1e-3, "scale": 2.0, "steps_per_report": 2, "steps_per_eval": 6}
    r = post(url, config)
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    events = events_of(url, job_id)
    assert events[-1]["type"] == "done", events[-3:]
    train_losses = [e["loss"] for e in events if e.get("type") == "metric" and e.get("kind") == "train"]
    val_losses = [e["loss"] for e in events if e.get("type") == "metric" and e.get("kind") == "val"]
    assert len(train_losses) == 6 and len(val_losses) == 3, events
    assert train_losses[-1] < train_losses[0] and val_losses[-1] < val_losses[0], (train_losses, val_losses)
    metric = next(e for e in events if e.get("kind") == "train")
    for key in ("step", "loss", "learning_rate", "grad_norm", "tokens_per_sec"):
        assert key in metric, metric
    with open(os.path.join(out, "adapter_config.json")) as f:
        cfg = json.load(f)
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["task_type"] == "CAUSAL_LM"
    assert os.path.getsize(os.path.join(out, "adapter_model.safetensors")) > 1000
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert len(f.readlines()) == 9
    job = httpx.get(f"{url}/api/jobs/{job_id}", timeout=10).json()["job"]
    assert job["status"] == "done" and job["output_path"] == out


def test_a_stop_request_saves_the_adapter_and_ends_done(fserver, dirs):
    url, train, root = fserver.url, dirs[1], dirs[2]
    out = os.path.join(root, "stopped")
    r = post(url, {"model_dir": "smollm2", "data_dir": train, "adapter_path": out, "iters": 5000, "steps_per_report": 1})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=900) as s:
        for line in s.iter_lines():
            if line.startswith("data:") and '"kind":"train"' in line.replace(" ", ""):
                break
    stop = httpx.post(f"{url}/api/jobs/{job_id}/stop", timeout=10)
    assert stop.status_code == 200, stop.text
    events = events_of(url, job_id)
    done = events[-1]
    assert done["type"] == "done" and done["summary"]["stopped"] is True, events[-3:]
    assert done["summary"]["steps"] < 5000
    assert os.path.exists(os.path.join(out, "adapter_model.safetensors"))
