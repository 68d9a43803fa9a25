"""Several models in one `kiln serve` (issue 37) through the official SDKs: two different
models answer with their own text, `--models-max 1` evicts, `keep_alive: 0` unloads, unknown
and path-shaped names are refused, 16 clients across two models all succeed, and a memory
budget that holds one model never holds two.

The two models live in a private kiln cache: `a` is the starter file, `b` the starter with a
random LoRA adapter fused in (`kiln fuse`), so its greedy text differs."""

import json
import os
import shutil
import subprocess
import threading
import time

import anthropic
import openai
import pytest

from conftest import KILN, MODEL, Server, httpx
from lora_files import write_adapter

MSGS = [{"role": "user", "content": "Name three colours."}]
# Small and fixed, so each model's bill is the same in every server of this file.
FLAGS = ["--parallel", "2", "--prompt-cache-bytes", "0", "--ctx", "512"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    models = root / "cache" / "models"
    models.mkdir(parents=True)
    starter = subprocess.run([KILN, "pull", "--quiet"], capture_output=True, text=True, check=True)
    src = starter.stdout.strip().splitlines()[-1]
    os.symlink(src, models / "a.gguf")
    adapter = write_adapter(str(root / "adapter"), seed=7, scale=4.0, b_amp=0.5)
    subprocess.run([KILN, "fuse", src, adapter, "--out", str(models / "b.gguf")],
                   check=True, capture_output=True)
    hf = root / "hf"
    hf.mkdir()
    return {"KILN_CACHE_DIR": str(root / "cache"), "HF_HUB_CACHE": str(hf), "dir": str(models)}


def start(cache, *extra):
    env = {k: v for k, v in cache.items() if k != "dir"}
    return Server(*FLAGS, *extra, env=env, model=os.path.join(cache["dir"], "a.gguf"))


@pytest.fixture(scope="module")
def pair(cache):
    s = start(cache)
    yield s
    assert s.stop() == 0


def statuses(url):
    data = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    return {m["id"]: m["status"] for m in data if m.get("parent") is None}


def chat(url, model, **extra):
    oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return oai.chat.completions.create(model=model, messages=MSGS, temperature=0, max_tokens=16,
                                       **extra)


def wait_for(pred, secs=10):
    deadline = time.time() + secs
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_two_models_answer_each_with_its_own_text(pair):
    assert statuses(pair.url) == {"a": "loaded", "b": "unloaded"}
    ra, rb = chat(pair.url, "a"), chat(pair.url, "b")
    assert (ra.model, rb.model) == ("a", "b")
    assert ra.choices[0].message.content and rb.choices[0].message.content
    assert ra.choices[0].message.content != rb.choices[0].message.content
    assert statuses(pair.url) == {"a": "loaded", "b": "loaded"}
    # The same model again answers the same (greedy), from the loaded copy.
    assert chat(pair.url, "b.gguf").choices[0].message.content == rb.choices[0].message.content
    anth = anthropic.Anthropic(base_url=pair.url, api_key="unused", max_retries=0)
    m = anth.messages.create(model="b", max_tokens=16, messages=MSGS)
    assert m.model == "b" and m.content[0].text
    # Each model's samples carry its name; each family's header is written once.
    metrics = httpx.get(pair.url + "/metrics", timeout=30).text
    assert 'vllm:num_requests_running{model_name="a"}' in metrics
    assert 'vllm:num_requests_running{model_name="b"}' in metrics
    assert metrics.count("# TYPE vllm:num_requests_running gauge") == 1
    cards = {m["id"]: m for m in httpx.get(pair.url + "/v1/models", timeout=30).json()["data"]}
    assert cards["b"]["context_length"] == 512 and cards["b"]["memory_bytes"] > 0


def test_unknown_and_path_names_are_refused(pair):
    oai = openai.OpenAI(base_url=pair.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=4)
    assert e.value.body["code"] == "model_not_found" and "available: " in e.value.body["message"]
    for bad in ["../a", "/etc/passwd", "a/../../b", "~/x"]:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=bad, messages=MSGS, max_tokens=4)
        assert "is a path" in str(e.value)
    anth = anthropic.Anthropic(base_url=pair.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        anth.messages.create(model="no-such-model", max_tokens=4, messages=MSGS)
    r = httpx.post(pair.url + "/v1/completions", json={"model": 7, "prompt": "x"}, timeout=30)
    assert r.status_code == 400 and "model must be a string" in r.text
    r = httpx.post(pair.url + "/v1/chat/completions", timeout=30,
                   json={"model": "a", "messages": MSGS, "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.text


def test_keep_alive_zero_unloads_and_load_unload_endpoints(pair):
    chat(pair.url, "b", extra_body={"keep_alive": 0})
    assert wait_for(lambda: statuses(pair.url)["b"] == "unloaded")
    r = httpx.post(pair.url + "/api/models/load", json={"model": "b", "keep_alive": "10m"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "loaded" and r.json()["keep_alive"] == "600s"
    r = httpx.post(pair.url + "/api/models/unload", json={"model": "b"}, timeout=60)
    assert r.json() == {"id": "b", "status": "unloaded"}
    assert statuses(pair.url)["b"] == "unloaded"
    assert httpx.post(pair.url + "/api/models/unload", json={"model": "b"}, timeout=30).status_code == 404
    assert httpx.post(pair.url + "/api/models/load", json={"model": "../b"}, timeout=30).status_code == 400
    assert httpx.post(pair.url + "/api/models/load", json={}, timeout=30).status_code == 400


def test_sixteen_clients_across_two_models(pair):
    errors, texts = [], {"a": set(), "b": set()}

    def client(i):
        model = "ab"[i % 2]
        try:
            r = chat(pair.url, model)
            texts[model].add(r.choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Greedy: each model gave one text to all its clients, and the two differ.
    assert len(texts["a"]) == 1 and len(texts["b"]) == 1 and texts["a"] != texts["b"]


def test_models_max_one_evicts_the_idle_model(cache):
    s = start(cache, "--models-max", "1")
    try:
        assert chat(s.url, "a").model == "a"
        assert chat(s.url, "b").model == "b"
        assert statuses(s.url) == {"a": "unloaded", "b": "loaded"}
        # The default model (no `model`) loads again in place of b.
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "a"
        assert statuses(s.url) == {"a": "loaded", "b": "unloaded"}
    finally:
        assert s.stop() == 0


def test_a_budget_that_holds_one_model_never_holds_two(cache, pair):
    bill = {m["id"]: m for m in httpx.get(pair.url + "/v1/models", timeout=30).json()["data"]}["a"]["memory_bytes"]
    budget_gb = bill * 1.5 / 1e9
    s = start(cache, "--memory-budget", f"{budget_gb:.6f}")
    try:
        assert statuses(s.url) == {"a": "loaded", "b": "unloaded"}
        seen, done = [], threading.Event()

        def watch():
            while not done.is_set():
                st = httpx.get(s.url + "/stats", timeout=30).json()
                seen.append((len(st["models"]), st["memory"]["billed_bytes"]))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        # While `a` streams, `b` waits for it to finish, then takes its place.
        oai = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        order = []
        stream = oai.chat.completions.create(model="a", messages=MSGS, max_tokens=48, stream=True,
                                             temperature=0, extra_body={"ignore_eos": True})
        first = next(iter(stream))
        assert first is not None

        def ask_b():
            order.append(("b", chat(s.url, "b").model))

        tb = threading.Thread(target=ask_b)
        tb.start()
        for _ in stream:
            pass
        order.append(("a", "done"))
        tb.join()
        done.set()
        watcher.join()
        assert order == [("a", "done"), ("b", "b")]
        assert statuses(s.url) == {"a": "unloaded", "b": "loaded"}
        assert seen and max(n for n, _ in seen) == 1
        assert max(b for _, b in seen) <= budget_gb * 1e9
    finally:
        assert s.stop() == 0


def test_a_model_that_fails_to_load_is_a_500_to_its_request_only(cache, pair):
    broken = os.path.join(cache["dir"], "broken.gguf")
    with open(broken, "wb") as f:
        f.write(b"GGUF" + b"\xff" * 64)
    try:
        oai = openai.OpenAI(base_url=pair.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            oai.chat.completions.create(model="broken", messages=MSGS, max_tokens=4)
        assert "loading model broken failed" in str(e.value)
        assert chat(pair.url, "a").choices[0].message.content
        assert statuses(pair.url)["broken"] == "unloaded"
    finally:
        os.remove(broken)


PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page")
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium")


@pytest.mark.skipif(not (CHROMIUM and shutil.which("node")
                         and os.path.isdir(os.path.join(PAGE, "node_modules", "playwright-core"))),
                    reason="needs chromium, node and playwright-core (scripts/e2e.sh installs it)")
def test_the_chat_page_picks_the_model(pair):
    out = subprocess.run(["node", os.path.join(PAGE, "chat_page.mjs"),
                          pair.url + "/?temperature=0&max_tokens=32", "b"],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "CHROMIUM": CHROMIUM})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["model"] == "a" and {"a", "b"} <= set(r["options"])
    assert r["answeredBy"] == "a" and r["picked"] == "b"
    assert not r["consoleErrors"]
