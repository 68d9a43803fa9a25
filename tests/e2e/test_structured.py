"""Structured output through the official SDKs: every answer under a JSON schema parses and
validates, greedy and sampled; json_object always parses; forced tool calls carry valid
arguments; schemas kiln cannot follow are a 400 naming the problem."""

import json

import jsonschema
import openai
import anthropic
import pytest

from conftest import MODEL

NAME = {"type": "string", "minLength": 1, "maxLength": 30}
# Strings and numbers carry bounds: a schema that admits an endless digit string or text lets a
# small model at temperature 1 write one until max_tokens (the grammar keeps the schema's
# meaning and does not invent limits).
INT = {"type": "integer", "minimum": -1000, "maximum": 1000}
SCHEMAS = {
    "object_required": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
                        "required": ["name", "age"]},
    "closed_object": {"type": "object", "properties": {"city": NAME, "country": NAME},
                      "required": ["city", "country"], "additionalProperties": False},
    "enum_string": {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "calm"]}},
                    "required": ["mood"], "additionalProperties": False},
    "enum_top_level": {"enum": ["red", "green", "blue"]},
    "bounded_integer": {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                        "required": ["score"]},
    "bounded_number": {"type": "object", "properties": {"t": {"type": "number", "minimum": -40, "maximum": 50}},
                       "required": ["t"], "additionalProperties": False},
    "exclusive_bounds": {"type": "object", "properties": {"p": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}},
                         "required": ["p"]},
    "pattern_date": {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
                     "required": ["date"], "additionalProperties": False},
    "pattern_code": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
                     "required": ["code"]},
    "array_of_strings": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4},
    "array_of_integers": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 5},
    "array_of_objects": {"type": "array", "maxItems": 3, "minItems": 1, "items": {
        "type": "object", "properties": {"item": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["item", "qty"], "additionalProperties": False}},
    "nested_object": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": NAME, "address": {
            "type": "object", "properties": {"street": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["person"], "additionalProperties": False},
    "boolean_field": {"type": "object", "properties": {"ok": {"type": "boolean"}, "why": NAME},
                      "required": ["ok", "why"]},
    "nullable": {"type": "object", "properties": {"middle_name": {"anyOf": [NAME, {"type": "null"}]}},
                 "required": ["middle_name"]},
    "one_of_kinds": {"type": "object", "properties": {"value": {"oneOf": [INT, {"type": "boolean"}]}},
                     "required": ["value"]},
    "const_field": {"type": "object", "properties": {"version": {"const": 2}, "label": NAME},
                    "required": ["version", "label"], "additionalProperties": False},
    "string_lengths": {"type": "object", "properties": {"tag": {"type": "string", "minLength": 3, "maxLength": 8}},
                       "required": ["tag"]},
    "refs": {"type": "object", "$defs": {"point": {"type": "object", "properties": {"x": INT, "y": INT},
                                                   "required": ["x", "y"], "additionalProperties": False}},
             "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
             "required": ["from", "to"], "additionalProperties": False},
    "matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                                                       "items": {"type": "integer", "minimum": 0, "maximum": 9}}},
    "optional_fields": {"type": "object", "properties": {"title": NAME, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                                         "genre": {"enum": ["drama", "comedy"]}},
                        "required": ["title"], "additionalProperties": False},
}

PROMPT = "Answer with JSON only. Describe something from everyday life."
RUNS = [dict(temperature=0), dict(temperature=0.9, seed=1), dict(temperature=1.0, seed=7)]


def ask(oai, schema, **sampling):
    r = oai.chat.completions.create(
        model=MODEL, max_tokens=300,
        messages=[{"role": "user", "content": PROMPT}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        **sampling,
    )
    return r.choices[0]


def test_at_least_twenty_schemas():
    assert len(SCHEMAS) >= 20


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_answer_validates(oai, name):
    schema = SCHEMAS[name]
    for sampling in RUNS:
        choice = ask(oai, schema, **sampling)
        text = choice.message.content
        assert choice.finish_reason == "stop", f"{name} {sampling}: ran out of tokens: {text!r}"
        value = json.loads(text)
        jsonschema.validate(value, schema)


def test_json_object_always_parses(oai):
    # A free-form object has no end the grammar could force: the 135M model, greedy, keeps
    # adding properties until max_tokens. Such an answer says finish_reason "length" (as
    # OpenAI's does); every answer the model finished parses.
    finished = 0
    for sampling in RUNS:
        r = oai.chat.completions.create(
            model=MODEL, max_tokens=300, messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
            response_format={"type": "json_object"}, **sampling)
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop"
        assert isinstance(json.loads(c.message.content), dict)
        finished += 1
    assert finished >= 1


WEATHER = {"type": "object", "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}


def test_forced_tool_call_arguments_validate(oai, anth):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": WEATHER, "strict": True}},
             {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
    for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
        r = oai.chat.completions.create(model=MODEL, max_tokens=200, tools=tools, tool_choice=choice, temperature=0,
                                        messages=[{"role": "user", "content": "Weather in Paris?"}])
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        call = c.message.tool_calls[0]
        if choice != "required":
            assert call.function.name == "get_weather"
        if call.function.name == "get_weather":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    # Parameters with $defs and $refs (what Pydantic writes) compile and validate too.
    order = {"type": "object", "$defs": {"line": {"type": "object", "properties": {
        "item": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["item", "qty"], "additionalProperties": False}},
        "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 3}},
        "required": ["lines"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Order two apples."}],
        tools=[{"type": "function", "function": {"name": "place_order", "parameters": order}}],
        tool_choice={"type": "function", "function": {"name": "place_order"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "place_order"
    jsonschema.validate(json.loads(call.function.arguments), order)
    m = anth.messages.create(model=MODEL, max_tokens=200,
                             tools=[{"name": "get_weather", "input_schema": WEATHER}],
                             tool_choice={"type": "tool", "name": "get_weather"},
                             messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"][0]
    jsonschema.validate(use.input, WEATHER)


@pytest.mark.parametrize("fmt, needle", [
    ({"type": "no_such_type"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no_such_type"}}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(unclosed"}}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema is required"),
])
def test_bad_formats_are_400(oai, fmt, needle):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                                    response_format=fmt)
    assert needle in str(e.value)


def test_streamed_structured_output_matches(oai):
    schema = SCHEMAS["closed_object"]
    whole = ask(oai, schema, temperature=0).message.content
    stream = oai.chat.completions.create(
        model=MODEL, max_tokens=300, temperature=0, stream=True,
        messages=[{"role": "user", "content": PROMPT}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole
    jsonschema.validate(json.loads(text), schema)
