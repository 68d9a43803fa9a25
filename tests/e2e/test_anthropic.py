"""The Anthropic surface through the official SDK."""

import anthropic
import pytest

from conftest import MODEL, httpx

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def test_messages_non_stream(anth):
    m = anth.messages.create(model=MODEL, max_tokens=20, messages=MSGS, extra_body={"temperature": 0}, system="Answer briefly.")
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens <= 20
    n = anth.messages.count_tokens(model=MODEL, messages=MSGS, system="Answer briefly.").input_tokens
    assert m.usage.input_tokens == n


def test_messages_stream_event_sequence(anth):
    ref = anth.messages.create(model=MODEL, max_tokens=20, messages=MSGS, extra_body={"temperature": 0})
    events = list(anth.messages.create(model=MODEL, max_tokens=20, messages=MSGS, extra_body={"temperature": 0}, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == ref.content[0].text
    delta = events[-2]
    assert delta.delta.stop_reason == ref.stop_reason
    assert delta.usage.output_tokens == ref.usage.output_tokens


def test_stop_sequences(anth):
    ref = anth.messages.create(model=MODEL, max_tokens=30, messages=MSGS, extra_body={"temperature": 0}).content[0].text
    word = ref.split()[min(2, len(ref.split()) - 1)]
    m = anth.messages.create(model=MODEL, max_tokens=30, messages=MSGS, extra_body={"temperature": 0}, stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert word not in m.content[0].text


def test_tool_result_round_trip(anth):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    msgs = MSGS + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    m = anth.messages.create(model=MODEL, max_tokens=16, messages=msgs, tools=tools, extra_body={"temperature": 0})
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_typed_errors(anth, keyed_server):
    with pytest.raises(anthropic.BadRequestError):
        anth.messages.create(model=MODEL, max_tokens=5, messages=[])
    bad = anthropic.Anthropic(base_url=keyed_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL, max_tokens=5, messages=MSGS)
    good = anthropic.Anthropic(base_url=keyed_server.url, api_key="sekrit", max_retries=0)
    assert good.messages.create(model=MODEL, max_tokens=3, messages=MSGS).content


def test_models_list_reads_in_the_anthropic_sdk(anth):
    models = anth.models.list().data
    assert models[0].type == "model" and models[0].created_at.year >= 2025
    assert anth.models.retrieve(models[0].id).id == models[0].id


def test_max_tokens_is_required_as_in_the_api(anth, server):
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "messages": MSGS}, timeout=30)
    assert r.status_code == 400
    assert r.json() == {"type": "error",
                        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}


def test_oversized_body_is_a_413_the_sdk_reads(anth):
    with pytest.raises(anthropic.APIStatusError) as e:
        anth.messages.create(model=MODEL, max_tokens=5,
                             messages=[{"role": "user", "content": "a" * (12 * 1024 * 1024)}])
    assert e.value.status_code == 413
    assert e.value.response.json()["error"]["type"] == "request_too_large"
