"""Embeddings on the real `kiln serve` (issue 38) through the official `openai` SDK: a tiny
random Qwen3 embedder (and BERT, nomic-bert, EmbeddingGemma, BERT and XLM-RoBERTa rerankers)
from a private Hugging Face cache, next to the chat model in the same
process, against what sentence-transformers made of it (crates/kiln-engine/tests/data/embed);
float and base64, `dimensions`, Ollama's `/api/embed`, and every refusal named."""

import base64
import json
import math
import os
import shutil
import struct

import openai
import pytest

from conftest import MODEL, ROOT, Server, httpx

DATA = os.path.join(ROOT, "crates", "kiln-engine", "tests", "data", "embed")
EMBEDDER = "kiln-test/qwen3-embed"
BERT = "kiln-test/bert-embed"
RERANKER = "kiln-test/bert-rerank"
XLMR_RERANKER = "kiln-test/xlmr-rerank"


def cache_repo(hf, name, folder):
    repo = hf / f"models--kiln-test--{name}"
    snap = repo / "snapshots" / "0123456789abcdef"
    shutil.copytree(os.path.join(DATA, folder), snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    hf = tmp_path_factory.mktemp("hf")
    cache_repo(hf, "qwen3-embed", "qwen3-last")
    cache_repo(hf, "bert-embed", "bert-cls")
    cache_repo(hf, "bert-rerank", "bert-rerank")
    cache_repo(hf, "xlmr-rerank", "xlmr-rerank")
    cache_repo(hf, "nomic-embed", "nomic-mean")
    cache_repo(hf, "gemma-embed", "gemma-embed")
    s = Server("--max-batch-inputs", "8", "--parallel", "2", env={"HF_HUB_CACHE": str(hf)})
    yield s
    assert s.stop() == 0


def reference(name):
    with open(os.path.join(DATA, "expected.json")) as f:
        return json.load(f)[name]


@pytest.fixture(scope="module")
def expected():
    return reference("qwen3-last")


@pytest.fixture(scope="module")
def oai(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_the_sdk_embeds_as_sentence_transformers_does(oai, expected):
    texts = [e["text"] for e in expected]
    r = oai.embeddings.create(model=EMBEDDER, input=texts)
    assert r.model == EMBEDDER and len(r.data) == len(texts)
    assert [d.index for d in r.data] == list(range(len(texts)))
    for d, e in zip(r.data, expected):
        assert cosine(d.embedding, e["embedding"]) >= 0.9999
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-5
    assert r.usage.prompt_tokens == sum(len(e["ids"]) for e in expected) == r.usage.total_tokens
    # Token ids give the same vectors as their text.
    t = oai.embeddings.create(model=EMBEDDER, input=[expected[0]["ids"]])
    assert cosine(t.data[0].embedding, r.data[0].embedding) > 0.999999


def test_base64_and_dimensions(oai, served, expected):
    text = expected[1]["text"]
    floats = oai.embeddings.create(model=EMBEDDER, input=text).data[0].embedding
    # The SDK decodes base64 itself; the raw body is little-endian f32.
    raw = httpx.post(served.url + "/v1/embeddings", timeout=60,
                     json={"model": EMBEDDER, "input": text, "encoding_format": "base64"}).json()
    b = base64.b64decode(raw["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(b) // 4}f", b)
    assert max(abs(x - y) for x, y in zip(decoded, floats)) < 1e-7
    # Asked for explicitly, the SDK hands the base64 string through.
    sdk = oai.embeddings.create(model=EMBEDDER, input=text, encoding_format="base64").data[0].embedding
    assert base64.b64decode(sdk) == b
    short = oai.embeddings.create(model=EMBEDDER, input=text, dimensions=16).data[0].embedding
    assert len(short) == 16 and abs(math.sqrt(sum(x * x for x in short)) - 1) < 1e-5
    head = floats[:16]
    assert cosine(short, head) > 0.999999


def test_ollama_embed_and_chat_in_the_same_process(oai, served, expected):
    r = httpx.post(served.url + "/api/embed", timeout=60,
                   json={"model": EMBEDDER, "input": [expected[2]["text"]]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == EMBEDDER and body["prompt_eval_count"] == len(expected[2]["ids"])
    assert cosine(body["embeddings"][0], expected[2]["embedding"]) >= 0.9999
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0)
    assert chat.choices[0].message.content
    listed = {m["id"]: m["status"] for m in httpx.get(served.url + "/v1/models", timeout=30).json()["data"]}
    assert listed[EMBEDDER] == "loaded"


def test_refusals_name_the_problem(oai, served):
    def refused(match, **kw):
        with pytest.raises(openai.BadRequestError) as e:
            oai.embeddings.create(model=kw.pop("model", EMBEDDER), **kw)
        assert match in str(e.value), str(e.value)

    refused("not an embedding model", model=MODEL, input="hi")
    refused("input[1] is empty", input=["a", ""])
    refused("empty list", input=[])
    refused("at most 8", input=["a"] * 9)
    refused("dimensions must be", input="a", dimensions=1000)
    refused("is not a token of this model", input=[[1, 10**6]])
    refused("but the context holds", input="fox " * 5000)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert "is an embedding model" in str(e.value)
    for body, match in [({"model": EMBEDDER}, "input is required"),
                        ({"model": EMBEDDER, "input": {"a": 1}}, "input must be"),
                        ({"model": EMBEDDER, "input": "a", "encoding_format": "int8"}, "encoding_format"),
                        ({"model": EMBEDDER, "input": ["a", 1]}, "input[1] must be a string")]:
        r = httpx.post(served.url + "/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 400 and match in r.text, r.text
    # Truncation on request: the long input is cut to the context.
    r = httpx.post(served.url + "/v1/embeddings", timeout=60,
                   json={"model": EMBEDDER, "input": "fox " * 5000, "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] <= 4096


def test_a_bert_embedder_through_the_sdk(oai):
    want = reference("bert-cls")
    r = oai.embeddings.create(model=BERT, input=[e["text"] for e in want])
    for d, e in zip(r.data, want):
        assert cosine(d.embedding, e["embedding"]) >= 0.9999
    assert r.usage.prompt_tokens == sum(len(e["ids"]) for e in want)


@pytest.mark.parametrize("model,folder", [("kiln-test/nomic-embed", "nomic-mean"),
                                          ("kiln-test/gemma-embed", "gemma-embed")])
def test_nomic_bert_and_embedding_gemma_through_the_sdk(oai, model, folder):
    want = reference(folder)
    r = oai.embeddings.create(model=model, input=[e["text"] for e in want])
    for d, e in zip(r.data, want):
        assert cosine(d.embedding, e["embedding"]) >= 0.9999
    assert r.usage.prompt_tokens == sum(len(e["ids"]) for e in want)


def test_an_xlm_roberta_reranker_orders_as_transformers_scores(served):
    want = reference("xlmr-rerank")
    r = httpx.post(served.url + "/v1/rerank", timeout=60,
                   json={"model": XLMR_RERANKER, "query": want[0]["query"],
                         "documents": [w["document"] for w in want]})
    assert r.status_code == 200, r.text
    order = sorted(range(len(want)), key=lambda i: -want[i]["score"])
    assert [x["index"] for x in r.json()["results"]] == order
    for x in r.json()["results"]:
        assert abs(x["relevance_score"] - want[x["index"]]["score"]) < 2e-3


def test_rerank_orders_as_transformers_scores(served):
    want = reference("bert-rerank")
    docs = [w["document"] for w in want]
    r = httpx.post(served.url + "/v1/rerank", timeout=60,
                   json={"model": RERANKER, "query": want[0]["query"], "documents": docs,
                         "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    order = sorted(range(len(want)), key=lambda i: -want[i]["score"])
    assert [x["index"] for x in body["results"]] == order
    for x in body["results"]:
        assert abs(x["relevance_score"] - want[x["index"]]["score"]) < 2e-3
        assert x["document"]["text"] == docs[x["index"]]
    assert body["usage"]["prompt_tokens"] == sum(len(w["ids"]) for w in want)
    top = httpx.post(served.url + "/v1/rerank", timeout=60,
                     json={"model": RERANKER, "query": want[0]["query"], "documents": docs, "top_n": 2}).json()
    assert [x["index"] for x in top["results"]] == order[:2] and "document" not in top["results"][0]
    tei = httpx.post(served.url + "/rerank", timeout=60,
                     json={"model": RERANKER, "query": want[0]["query"], "texts": docs, "return_text": True}).json()
    assert [x["index"] for x in tei] == order and tei[0]["text"] == docs[order[0]]
    assert abs(tei[0]["score"] - want[order[0]]["score"]) < 2e-3


def test_rerank_refusals(served, oai):
    url = served.url + "/v1/rerank"
    for body, match in [({"model": BERT, "query": "q", "documents": ["a"]}, "is not a reranker"),
                        ({"model": RERANKER, "documents": ["a"]}, "query is required"),
                        ({"model": RERANKER, "query": "q", "documents": []}, "empty list"),
                        ({"model": RERANKER, "query": "q", "documents": ["a", 3]}, "documents[1] must be a string"),
                        ({"model": RERANKER, "query": "q", "documents": ["a"] * 9}, "at most 8"),
                        ({"model": RERANKER, "query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
                        ({"model": RERANKER, "query": "q " * 300, "documents": ["a"]}, "but the context holds")]:
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400 and match in r.text, (body, r.text)
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=RERANKER, input="hi")
    assert "is a reranker" in str(e.value)
