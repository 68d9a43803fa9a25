"""The Responses API through the official openai SDK: whole and streamed answers, a function
call round trip, previous_response_id, store: false, and text.format."""

import json

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import jsonschema
import openai
import pytest

from conftest import MODEL

QUESTION = "What is the capital of France?"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                               "required": ["city"], "additionalProperties": False}}


def test_whole_response(oai):
    r = oai.responses.create(model=MODEL, input=QUESTION, max_output_tokens=40, temperature=0)
    assert r.id.startswith("resp_")
    assert r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.output_text.strip()
    assert r.output[-1].type == "message"
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 40
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_events_in_order_and_deltas_make_the_text(oai):
    whole = oai.responses.create(model=MODEL, input=QUESTION, max_output_tokens=40, temperature=0)
    events = list(oai.responses.create(model=MODEL, input=QUESTION, max_output_tokens=40, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    message_events = [k for k in kinds if k in (
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done")]
    # added, part added, deltas…, text done, part done, item done
    assert message_events[:2] == ["response.output_item.added", "response.content_part.added"]
    assert message_events[-3:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_function_call_round_trip(oai):
    r = oai.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER_TOOL],
                             tool_choice="required", max_output_tokens=100, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])
    answer = oai.responses.create(
        model=MODEL, previous_response_id=r.id, tools=[WEATHER_TOOL], max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert answer.output[-1].type == "message"
    assert answer.output_text.strip()
    # The same turn replayed by hand instead of by id gives the same answer.
    replay = oai.responses.create(
        model=MODEL, tools=[WEATHER_TOOL], max_output_tokens=40, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert replay.output_text == answer.output_text


def test_previous_response_id_continues_the_conversation(oai):
    first = oai.responses.create(model=MODEL, instructions="You are a helpful assistant.",
                                 input="My name is Ada.", max_output_tokens=20, temperature=0)
    second = oai.responses.create(model=MODEL, previous_response_id=first.id,
                                  input="What is my name?", max_output_tokens=20, temperature=0)
    assert second.previous_response_id == first.id
    assert second.instructions == "You are a helpful assistant."
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, previous_response_id="resp_nope", input="hi", max_output_tokens=5)


def test_store_false_is_not_kept(oai, server):
    r = oai.responses.create(model=MODEL, input="hi", max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, previous_response_id=r.id, input="again", max_output_tokens=5)
    stats = httpx.get(server.url + "/stats").json()["responses_store"]
    assert stats["max_bytes"] == 32 << 20 and stats["ttl_secs"] == 3600 and stats["entries"] >= 1


def test_text_format_json_schema(oai):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 30}},
              "required": ["capital"], "additionalProperties": False}
    r = oai.responses.create(model=MODEL, input=QUESTION, max_output_tokens=60, temperature=0,
                             text={"format": {"type": "json_schema", "name": "capital", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=MODEL, input="hi", text={"format": {"type": "yaml"}})


def test_models_carry_context_window(oai):
    m = oai.models.list().data[0]
    assert m.model_extra["context_window"] > 0
