"""LoRA adapters on the real `kiln serve` (spec §3.7) through the official SDKs: `--adapter`,
the per-request `adapter` field, mount/unmount over HTTP, and mount/unmount under load."""

import os
import subprocess
import threading

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import anthropic
import openai
import pytest

from conftest import MODEL, KILN, Server
from lora_files import write_adapter

MSGS = [{"role": "user", "content": "Name three kitchen tools."}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a": write_adapter(str(root / "a"), seed=1),
        "b": write_adapter(str(root / "b"), seed=2),
        "c": write_adapter(str(root / "c"), seed=3, projections=["self_attn.q_proj", "mlp.down_proj"]),
        "wide": write_adapter(str(root / "wide"), seed=4, projections=["self_attn.q_proj"],
                              widen=(3, "self_attn.q_proj")),
    }


@pytest.fixture(scope="module")
def served(folders):
    # The first --adapter is the default of requests that name none.
    s = Server("--adapter", f"a={folders['a']}", "--parallel", "4")
    yield s
    assert s.stop() == 0


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def chat(oai, adapter=None, max_tokens=20, **kw):
    extra = {"ignore_eos": True}
    if adapter is not None:
        extra["adapter"] = adapter
    r = oai.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=max_tokens,
                                    extra_body=extra, **kw)
    return r.choices[0].message.content


def test_an_adapter_changes_the_greedy_answer_and_none_is_the_base(served):
    oai = client(served)
    with_a, base = chat(oai, "a"), chat(oai, "none")
    assert with_a != base
    assert chat(oai) == with_a, "--adapter's first entry is the default"
    assert chat(oai, "a") == with_a and chat(oai, "none") == base, "greedy and cache-safe"

    comp = lambda a: oai.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=12,
                                            extra_body={"adapter": a}).choices[0].text
    assert comp("a") != comp("none")

    anth = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    # (this SDK version takes no temperature argument; the server reads the body's)
    msg = lambda a: anth.messages.create(model=MODEL, max_tokens=12, messages=MSGS,
                                         extra_body={"adapter": a, "temperature": 0}).content[0].text
    assert msg("a") != msg("none")


def test_an_unknown_adapter_is_a_400_naming_it(served):
    oai = client(served)
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, "nope", max_tokens=4)
    assert "adapter nope not mounted" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, "a+nope", max_tokens=4)
    assert "adapter nope not mounted" in str(e.value)
    anth = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(model=MODEL, max_tokens=4, messages=MSGS, extra_body={"adapter": "nope"})
    assert "adapter nope not mounted" in str(e.value)


def test_mount_list_unmount_round_trip(served, folders):
    url = served.url
    r = httpx.post(url + "/v1/adapters", json={"id": "b", "path": folders["b"]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "b", "mounted_layers": 210, "rank": 8, "scale": 2.0}
    listed = {a["id"]: a for a in httpx.get(url + "/v1/adapters").json()["adapters"]}
    assert set(listed) == {"a", "b"}
    assert listed["b"]["path"] == folders["b"] and listed["b"]["mounted_layers"] == 210
    assert listed["b"]["size_bytes"] == os.path.getsize(os.path.join(folders["b"], "adapters.safetensors")) - \
        _header_bytes(os.path.join(folders["b"], "adapters.safetensors"))

    oai = client(served)
    with_b = chat(oai, "b")
    assert with_b not in (chat(oai, "a"), chat(oai, "none"))
    assert chat(oai, "a+b") not in (with_b, chat(oai, "a"))

    for body, needle in [({"path": folders["b"]}, "id is required"),
                         ({"id": "x"}, "path is required"),
                         ({"id": "b", "path": folders["a"]}, "adapter b is already mounted"),
                         ({"id": "x", "path": "/nonexistent/kiln"}, "is not a folder"),
                         ({"id": "x", "path": folders["wide"]}, "model.layers.3.self_attn.q_proj")]:
        r = httpx.post(url + "/v1/adapters", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert needle in r.json()["error"]["message"], (body, r.text)

    r = httpx.delete(url + "/v1/adapters/b")
    assert r.status_code == 200 and r.json() == {"id": "b", "removed_layers": 210}
    r = httpx.delete(url + "/v1/adapters/b")
    assert r.status_code == 404 and r.json()["error"]["message"] == "adapter b not mounted"
    with pytest.raises(openai.BadRequestError):
        chat(oai, "b", max_tokens=4)
    stats = httpx.get(url + "/stats").json()["adapters"]
    assert [a["id"] for a in stats["adapters"]] == ["a"] and stats["default"] == "a"


def _header_bytes(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_mount_and_unmount_under_load_lose_no_request(served, folders):
    url = served.url
    assert httpx.post(url + "/v1/adapters", json={"id": "b", "path": folders["b"]}, timeout=60).status_code == 200
    oai = client(served)
    want = {"b": chat(oai, "b", max_tokens=24), "none": chat(oai, "none", max_tokens=24)}
    assert want["b"] != want["none"]

    n = 12
    started = threading.Semaphore(0)
    results = [None] * n

    def run(i, adapter):
        try:
            stream = oai.chat.completions.create(
                model=MODEL, messages=MSGS, temperature=0, max_tokens=24, stream=True,
                extra_body={"adapter": adapter, "ignore_eos": True})
            text, first = "", True
            for chunk in stream:
                if first:
                    # The response has begun: the request resolved its adapter.
                    started.release()
                    first = False
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            results[i] = (adapter, text)
        except Exception as e:  # noqa: BLE001 — reported below
            results[i] = (adapter, e)
            started.release()

    threads = [threading.Thread(target=run, args=(i, "none" if i % 3 == 2 else "b")) for i in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        assert started.acquire(timeout=60)
    # Every request holds its adapter; unmount b and churn the registry while they run.
    assert httpx.delete(url + "/v1/adapters/b").status_code == 200
    for _ in range(5):
        r = httpx.post(url + "/v1/adapters", json={"id": "c", "path": folders["c"]}, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.delete(url + "/v1/adapters/c").status_code == 200
    for t in threads:
        t.join(120)
    for adapter, text in results:
        assert not isinstance(text, Exception), f"{adapter}: {text!r}"
        assert text == want[adapter], adapter
    requests = httpx.get(url + "/stats").json()["requests"]
    assert requests["failed"] == 0 and requests["cancelled"] == 0, requests


def test_adapter_flags_fail_fast_naming_the_flag(folders):
    for flags, needle in [(["--adapter", "=x"], "--adapter"),
                          (["--adapter", "a="], "--adapter"),
                          (["--adapter", "a+b=/x"], "--adapter"),
                          (["--adapter", "zz=/nonexistent/kiln"], "--adapter zz=/nonexistent/kiln"),
                          (["--adapter", f"w={folders['wide']}"], "model.layers.3.self_attn.q_proj"),
                          (["--adapter", f"a={folders['a']}", "--adapter", f"a={folders['b']}"], "given twice"),
                          (["--adapter", f"a={folders['a']}", "--default-adapter", "b"], "--default-adapter b")]:
        out = subprocess.run([KILN, "serve", "--port", "0", *flags], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0, flags
        assert needle in out.stderr and "panicked" not in out.stderr, (flags, out.stderr)


def test_default_adapter_none_serves_the_base(folders):
    s = Server("--adapter", f"a={folders['a']}", "--default-adapter", "none")
    try:
        oai = client(s)
        assert chat(oai) == chat(oai, "none") != chat(oai, "a")
    finally:
        s.stop()


def test_the_model_field_names_an_adapter_as_in_vllm(served, folders):
    url = served.url
    assert httpx.post(url + "/v1/adapters", json={"id": "b", "path": folders["b"]}, timeout=60).status_code == 200
    try:
        oai = client(served)
        by_field = chat(oai, "b", max_tokens=12)
        by_model = oai.chat.completions.create(model="b", messages=MSGS, temperature=0, max_tokens=12,
                                               extra_body={"ignore_eos": True}).choices[0].message.content
        assert by_model == by_field and by_model != chat(oai, "none", max_tokens=12)
        # An explicit `adapter` wins over the model name.
        explicit = oai.chat.completions.create(model="b", messages=MSGS, temperature=0, max_tokens=12,
                                               extra_body={"ignore_eos": True, "adapter": "none"})
        assert explicit.choices[0].message.content == chat(oai, "none", max_tokens=12)

        models = {m.id: m for m in oai.models.list().data}
        base = [m for m in models.values() if getattr(m, "parent", None) is None]
        assert len(base) == 1 and base[0].status == "loaded" and base[0].context_length > 0
        assert models["b"].parent == base[0].id and models["b"].status == "loaded"
        assert models["a"].parent == base[0].id
        assert oai.models.retrieve("b").parent == base[0].id
        with pytest.raises(openai.NotFoundError) as e:
            oai.models.retrieve("nope")
        assert e.value.code == "model_not_found" and ", a, b" in str(e.value)
    finally:
        assert httpx.delete(url + "/v1/adapters/b").status_code == 200


def _samples(text):
    """`{name: [(labels, value)]}` of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = dict(p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
        out.setdefault(name, []).append(({k: v.strip('"') for k, v in pairs.items()}, float(value)))
    return out


GATEWAY_NAMES = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:lora_requests_info", "vllm:cache_config_info", "vllm:prefix_cache_hits_total",
                 "vllm:prefix_cache_queries_total"]


def test_the_gateway_metrics_move_under_load(served):
    """The names the Gateway API Inference Extension's endpoint picker scrapes, read every 50 ms
    while 8 requests share 4 slots: some wait, the running ones show their adapter, the KV in use
    grows with their context, and the prefix-cache counters count prompt tokens."""
    url = served.url
    before = _samples(httpx.get(url + "/metrics").text)
    for name in GATEWAY_NAMES:
        assert name in before, name
    cfg = before["vllm:cache_config_info"][0][0]
    assert int(cfg["block_size"]) > 0 and int(cfg["num_gpu_blocks"]) > 0
    info = before["vllm:lora_requests_info"][0][0]
    assert int(info["max_lora"]) == 4

    oai = client(served)
    done = threading.Event()
    errors = []

    def run():
        try:
            chat(oai, "a", max_tokens=48)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    seen = {"waiting": 0.0, "running": 0.0, "lora": set(), "usage": []}
    watcher_done = threading.Event()

    def watch():
        while not done.is_set():
            s = _samples(httpx.get(url + "/metrics").text)
            seen["waiting"] = max(seen["waiting"], s["vllm:num_requests_waiting"][0][1])
            seen["running"] = max(seen["running"], s["vllm:num_requests_running"][0][1])
            labels, stamp = s["vllm:lora_requests_info"][0]
            assert stamp > 1.7e9, "the value is the update time"
            seen["lora"].update(x for x in labels["running_lora_adapters"].split(",") if x)
            if s["vllm:num_requests_running"][0][1] > 0:
                seen["usage"].append(s["vllm:kv_cache_usage_perc"][0][1])
            done.wait(0.05)
        watcher_done.set()

    w = threading.Thread(target=watch)
    w.start()
    for t in threads:
        t.join(180)
    done.set()
    w.join(30)
    assert not errors, errors
    assert seen["waiting"] > 0, "8 requests on 4 slots: some waited"
    assert seen["running"] > 1
    assert seen["lora"] == {"a"}
    usage = [u for u in seen["usage"] if u > 0]
    assert usage and all(0 < u <= 1 for u in usage)
    assert max(usage) > min(usage), f"KV in use grows with the context: {usage[:5]}…"

    after = _samples(httpx.get(url + "/metrics").text)
    queries = after["vllm:prefix_cache_queries_total"][0][1] - before["vllm:prefix_cache_queries_total"][0][1]
    hits = after["vllm:prefix_cache_hits_total"][0][1] - before["vllm:prefix_cache_hits_total"][0][1]
    assert queries > 0 and 0 <= hits <= queries
    assert after["vllm:num_requests_running"][0][1] == 0
    assert after["vllm:kv_cache_usage_perc"][0][1] == 0, "finished: nothing in use"


def test_available_lists_the_folders_that_fit(folders, tmp_path):
    root = os.path.dirname(folders["a"])
    os.makedirs(os.path.join(root, "not-an-adapter"), exist_ok=True)
    broken = os.path.join(root, "broken")
    os.makedirs(broken, exist_ok=True)
    with open(os.path.join(broken, "adapter_config.json"), "w") as f:
        f.write("{not json")
    s = Server("--adapter", f"a={folders['a']}", "--adapters-dir", root)
    try:
        body = httpx.get(s.url + "/v1/adapters/available", timeout=60).json()
        listed = {a["id"]: a for a in body["adapters"]}
        assert set(listed) == {"a", "b", "c"}, body
        assert listed["a"]["mounted"] and not listed["b"]["mounted"]
        assert listed["b"]["path"] == folders["b"] and listed["b"]["rank"] > 0
        skipped = {os.path.basename(x["path"]): x["reason"] for x in body["skipped"]}
        assert set(skipped) == {"wide", "broken"}, skipped
        assert "model.layers.3.self_attn.q_proj" in skipped["wide"]
        # What it lists mounts as it says.
        r = httpx.post(s.url + "/v1/adapters", json={"id": "b", "path": listed["b"]["path"]}, timeout=60)
        assert r.status_code == 200, r.text
        again = {a["id"]: a for a in httpx.get(s.url + "/v1/adapters/available", timeout=60).json()["adapters"]}
        assert again["b"]["mounted"]
    finally:
        assert s.stop() == 0
