"""The OpenAI surface through the official SDK."""

import json
import re
import subprocess
import threading
import time

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest

from conftest import KILN, MODEL

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_non_stream_and_stream_agree(oai, server):
    r = oai.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=20)
    c = r.choices[0]
    assert r.object == "chat.completion"
    assert r.model == "SmolLM2-135M-Instruct.Q4_1" or MODEL != "smollm2"  # the served id, not the alias
    assert c.finish_reason in ("stop", "length")
    assert c.message.role == "assistant" and c.message.content
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens <= 20

    chunks = list(
        oai.chat.completions.create(
            model=MODEL, messages=MSGS, temperature=0, max_tokens=20, stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == c.finish_reason
    usage = chunks[-1].usage
    assert usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens
    # The same prompt again reuses the cached prefix.
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_completions(oai):
    r = oai.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=12)
    assert r.object == "text_completion"
    assert r.choices[0].text
    chunks = list(oai.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=12, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # Streamed legacy logprobs go out with their tokens' text: chunks carry them, and joined
    # they cover every token, in order, with text_offset running through the whole text.
    chunks = list(oai.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=12,
                                         stream=True, logprobs=2))
    carried = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs and c.choices[0].logprobs.tokens]
    assert len(carried) > 1, "logprobs arrived all at once"
    tokens = [t for lp in carried for t in lp.tokens]
    offsets = [o for lp in carried for o in lp.text_offset]
    assert len(tokens) == r.usage.completion_tokens and len(carried[0].top_logprobs[0]) == 2
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_logprobs_and_exact_usage(oai, anth):
    r = oai.chat.completions.create(
        model=MODEL, messages=MSGS, temperature=0, max_tokens=10, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for tok in content:
        tops = [t.logprob for t in tok.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert tok.token == tok.top_logprobs[0].token
        assert abs(tok.logprob - tops[0]) < 1e-5
    assert "".join(bytes(t.bytes).decode("utf-8", "replace") for t in content) == r.choices[0].message.content
    # Streamed: the logprobs arrive with their tokens' content (not all at the end) and agree
    # with the non-streamed ones.
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=MSGS, temperature=0, max_tokens=10, logprobs=True, top_logprobs=3, stream=True))
    with_lp = [ch for ch in chunks if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content]
    assert len(with_lp) > 1, "logprobs arrived all at once"
    assert all(ch.choices[0].delta.content for ch in with_lp[:-1])
    streamed = [t for ch in with_lp for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    # The prompt count agrees with Anthropic's count_tokens for the same conversation.
    n = anth.messages.count_tokens(model=MODEL, messages=MSGS).input_tokens
    assert r.usage.prompt_tokens == n


def test_greedy_matches_kiln_generate(oai):
    prompt = "Once upon a time"
    out = subprocess.run(
        [KILN, "generate", MODEL, prompt, "--temperature", "0", "--max-tokens", "24", "--json"],
        capture_output=True, text=True, check=True,
    )
    direct = json.loads(out.stdout)
    r = oai.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24, logprobs=0)
    assert r.choices[0].text == direct["text"]
    assert r.usage.completion_tokens == len(direct["tokens"])

    out = subprocess.run(
        [KILN, "generate", MODEL, MSGS[0]["content"], "--chat", "--temperature", "0", "--max-tokens", "24", "--json"],
        capture_output=True, text=True, check=True,
    )
    direct = json.loads(out.stdout)
    r = oai.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == direct["text"]
    assert r.usage.completion_tokens == len(direct["tokens"])


def test_stop_string_spanning_tokens_never_leaks(oai):
    prompt = "Here is a list of fruits:"
    r = oai.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=40, logprobs=0)
    text = r.choices[0].text
    offsets = r.choices[0].logprobs.text_offset
    # A 6-character stop string with a token boundary strictly inside it.
    start = next(o - 3 for o in offsets[3:] if o >= 3 and len(text) >= o + 3 and text[o - 3 : o + 3].strip())
    stop = text[start : start + 6]
    expected = text[: text.find(stop)]
    chunks = list(oai.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=40, stop=[stop], stream=True))
    streamed = "".join(ch.choices[0].text for ch in chunks)
    assert streamed == expected, (stop, streamed)
    assert chunks[-1].choices[0].finish_reason == "stop"
    for ch in chunks:
        assert stop[:3] not in ch.choices[0].text or ch.choices[0].text in expected


def test_typed_errors(oai, keyed_server):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[])
    assert "messages" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=10**9)
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekrit", max_retries=0)
    assert good.models.list().data[0].id
    assert httpx.get(keyed_server.url + "/health").status_code == 200


def test_oversized_body_is_a_413_the_sdk_reads(oai, server):
    # The SDK sends the whole 12 MB before it reads: the server must drain it, not reset.
    big = [{"role": "user", "content": "a" * (12 * 1024 * 1024)}]
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=MODEL, messages=big)
    assert e.value.status_code == 413
    assert "too large" in e.value.response.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


MALFORMED = [
    ("wrong types", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400),
    ("empty messages", b'{"messages": []}', 400),
    ("unknown role", b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400),
    ("invalid JSON", b'{"messages": [', 400),
    ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    ("10 MB body", b'{"messages": "' + b"a" * (10 * 1024 * 1024) + b'"}', 413),
    ("max_tokens 1e9", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000000}', 400),
    ("1000 stop strings", json.dumps({"messages": MSGS, "stop": [f"s{i}" for i in range(1000)]}).encode(), 400),
]


@pytest.mark.parametrize("name,body,status", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input(server, name, body, status):
    r = httpx.post(server.url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def first_content_latency(url, body):
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    raise AssertionError("no content")


def test_disconnect_frees_engine(server):
    body = {"messages": [{"role": "user", "content": "Count slowly from one to a hundred."}],
            "stream": True, "temperature": 0, "max_tokens": 400}
    short = {"messages": [{"role": "user", "content": "Say hi."}], "stream": True, "max_tokens": 5, "temperature": 0}

    def after_long(max_tokens):
        # Baseline: the same sequence with a long request that finishes on its own, so the
        # short prompt misses the prefix cache in both cases and only the disconnect differs.
        httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": max_tokens}, timeout=60)
        return first_content_latency(server.url, short)

    baseline = min(after_long(1) for _ in range(3))
    cancelled_before = httpx.get(server.url + "/stats").json()["requests"]["cancelled"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
            if got >= 5:
                break
    # Leaving the `with` closes the connection mid-stream.
    latency = first_content_latency(server.url, short)
    print(f"disconnect: extra {latency - baseline:.3f}s over baseline {baseline:.3f}s")
    assert latency - baseline < 0.100, f"next request waited {latency - baseline:.3f}s extra (baseline {baseline:.3f}s)"
    stats = httpx.get(server.url + "/stats").json()
    assert stats["requests"]["cancelled"] > cancelled_before


def test_non_stream_client_that_gives_up_cancels(server):
    body = {"messages": [{"role": "user", "content": "Count slowly from one to a hundred."}],
            "temperature": 0, "max_tokens": 400, "ignore_eos": True}
    before = httpx.get(server.url + "/stats").json()["requests"]["cancelled"]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.5)
    deadline = time.time() + 1.0
    while httpx.get(server.url + "/stats").json()["requests"]["cancelled"] == before:
        assert time.time() < deadline, "the abandoned generation kept running"
        time.sleep(0.02)
    assert httpx.get(server.url + "/stats").json()["queue"]["running"] == 0


def test_sixteen_concurrent_streams(oai):
    msgs = [{"role": "user", "content": "Name a color."}]
    ref = oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=8).choices[0].message.content
    results, errors = [None] * 16, []

    def run(i):
        try:
            s = oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=8, stream=True)
            results[i] = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results == [ref] * 16


def test_tool_round_trip_history(oai):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    r = oai.chat.completions.create(model=MODEL, messages=msgs, tools=tools, temperature=0, max_tokens=16)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    for call in c.message.tool_calls or []:
        assert isinstance(call.function.arguments, str)
        json.loads(call.function.arguments)


def test_discovery(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    idx = httpx.get(server.url + "/v1").json()
    spec = httpx.get(server.url + "/openapi.json").json()
    for ep in idx["endpoints"]:
        assert ep["method"].lower() in spec["paths"][ep["path"]]
    metrics = httpx.get(server.url + "/metrics").text
    assert "vllm:num_requests_waiting" in metrics
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "<title>kiln</title>" in page.text


def test_every_route_the_server_answers_is_described(server):
    """Over the real, merged router: the jobs and lab routes are in /openapi.json beside the
    API's, and every described route is answered by a handler, not the 404/405 fallbacks."""
    spec = httpx.get(server.url + "/openapi.json").json()
    for method, path in [("post", "/api/jobs"), ("get", "/api/jobs/{id}/stream"),
                         ("post", "/api/quantize/submit"), ("get", "/api/lab/models"),
                         ("get", "/lab"), ("get", "/lab/assets/{name}"), ("get", "/jobs")]:
        assert method in spec["paths"].get(path, {}), f"{method} {path} not described"
    index = {(e["method"].lower(), e["path"]) for e in httpx.get(server.url + "/v1").json()["endpoints"]}
    described = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert index == described
    for method, path in sorted(described):
        url = server.url + re.sub(r"\{[^}]+\}", "nope", path)
        # Malformed JSON: every POST refuses it before doing anything.
        body = {"content": b"{", "headers": {"content-type": "application/json"}} if method == "post" else {}
        r = httpx.request(method.upper(), url, follow_redirects=False, timeout=30, **body)
        assert r.status_code != 405, f"{method} {path}: {r.status_code} {r.text[:200]}"
        fallback = r.status_code == 404 and r.text.find("not found: /") >= 0
        assert not fallback, f"{method} {path} is described but not routed: {r.text[:200]}"


def test_prompt_cache_across_conversations(oai, server):
    a = [{"role": "user", "content": "Tell me about the moon in one sentence."}]
    b = [{"role": "user", "content": "Name three kinds of trees."}]
    ra = oai.chat.completions.create(model=MODEL, messages=a, temperature=0, max_tokens=8)
    oai.chat.completions.create(model=MODEL, messages=b, temperature=0, max_tokens=8)
    # Conversation A's next turn re-prefills only the new turn, although B ran in between.
    a2 = a + [{"role": "assistant", "content": ra.choices[0].message.content},
              {"role": "user", "content": "And the sun?"}]
    r = oai.chat.completions.create(model=MODEL, messages=a2, temperature=0, max_tokens=8)
    assert r.usage.prompt_tokens_details.cached_tokens >= ra.usage.prompt_tokens - 1
    pc = httpx.get(server.url + "/stats").json()["prompt_cache"]
    assert pc["entries"] >= 2 and pc["hits"] >= 1 and pc["bytes"] > 0
