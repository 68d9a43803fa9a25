"""Dataset jobs against the real server on the test model: the LLM templates call the server's
own /v1/chat/completions over loopback, with its API key (the server here has one), and write
well-formed rows split 90/10; `kiln dataset` and `kiln jobs` reach a keyed server too."""

import json
import os
import subprocess
import time

try:  # openai>=3 ships its HTTP client as httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest

from conftest import KILN

KEY = {"authorization": "Bearer sekrit"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

# template id -> (inputs, row format, exact row count or None when the model's output decides it)
CASES = {
    "style_transfer": ({"reference_samples": "Arr, matey! The sea be calm.\n---\nAye, the wind be fair.",
                        "raw_text": "The meeting starts at nine.\n\nPlease bring your laptop."}, "prompt_completion", 2),
    "self_instruct": ({"seeds": "Write a short poem about the sea.", "variants_per_seed": 2}, "messages", None),
    "prompt_reconstruction": ({"target_text": "Caching keeps recent results close.\n\nA miss costs a trip to slow storage."},
                              "messages", 2),
    "multi_turn_chat": ({"seeds": "Hi! Can you recommend a book?", "turns": 2}, "messages", 1),
    "tool_use_traces": ({"tools_json": json.dumps(TOOLS), "scenarios": "What is the weather in Paris?\nIs it raining in Berlin?",
                         "mock_results": json.dumps({"get_weather": {"temp_c": 21}})}, "messages", None),
    "rag_qa": ({"documents": "The Eiffel Tower is in Paris. It was finished in 1889 and is 330 metres tall.",
                "questions_per_chunk": 2, "min_chunk_chars": 50}, "messages", None),
    "cot_synthesis": ({"questions": "What is 12 plus 7?\nI have 3 apples and eat one. How many are left?"}, "messages", 2),
    "verified_code": ({"specs": "a function add(a, b) that returns the sum of two numbers"}, "messages", None),
}
ZERO_ROWS = "generator produced 0 rows — check your inputs"


def submit(server, body, headers=KEY):
    return httpx.post(server.url + "/api/dataset/submit", json=body, headers=headers, timeout=30)


def wait(server, job_id, secs=180):
    deadline = time.time() + secs
    while time.time() < deadline:
        job = httpx.get(f"{server.url}/api/jobs/{job_id}", headers=KEY, timeout=30).json()["job"]
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end")


def rows_of(path):
    with open(path) as f:
        text = f.read()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def check_rows(rows, fmt):
    for r in rows:
        if fmt == "messages":
            roles = [m["role"] for m in r["messages"]]
            assert roles[-1] == "assistant" and "user" in roles, r
            assert all(isinstance(m["content"], str) for m in r["messages"])
            assert r["messages"][-1]["content"].strip()
        else:
            assert set(r) == {"prompt", "completion"} and r["completion"].strip(), r


def test_templates_are_listed_with_their_fields(keyed_server):
    r = httpx.get(keyed_server.url + "/api/dataset/templates", headers=KEY, timeout=30)
    assert r.status_code == 200
    templates = {t["id"]: t for t in r.json()["templates"]}
    assert len(templates) == 13 and set(CASES) <= set(templates)
    qa = templates["sft_qa_pairs"]
    assert (qa["output_format"], qa["llm"], qa["fields"][0]["name"], qa["fields"][0]["type"]) == \
        ("messages", False, "pairs_text", "textarea")
    assert templates["multi_turn_chat"]["fields"][1]["default"] == 4
    assert httpx.get(keyed_server.url + "/api/dataset/templates", timeout=30).status_code == 401


@pytest.mark.parametrize("template", sorted(CASES))
def test_llm_template_builds_rows_through_the_served_model(keyed_server, tmp_path, template):
    inputs, fmt, count = CASES[template]
    out = tmp_path / "ds"
    r = submit(keyed_server, {"template_id": template, "inputs": inputs, "output_dir": str(out),
                              "max_tokens": 64, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["output_dir"] == str(out)
    job = wait(keyed_server, r.json()["job_id"])
    if template == "verified_code" and job["status"] == "failed":
        # The model's code had no passing module-level asserts: nothing verified, nothing kept.
        assert job["error"] == ZERO_ROWS
        return
    assert job["status"] == "done", job
    rows = rows_of(out / "train.jsonl") + rows_of(out / "valid.jsonl")
    n = int(job["message"].removeprefix("Wrote ").removesuffix(" rows."))
    train, valid = rows_of(out / "train.jsonl"), rows_of(out / "valid.jsonl")
    assert len(train) == max(1, n * 9 // 10)
    assert len(valid) == (n - len(train) or 1)
    if count is not None:
        assert n == count
    check_rows(rows, fmt)
    if template == "verified_code":
        assert all(r["verified"] is True for r in rows)


def test_zero_rows_fail_with_the_specs_error(keyed_server, tmp_path):
    r = submit(keyed_server, {"template_id": "sft_qa_pairs", "inputs": {"pairs_text": "no pairs at all"},
                              "output_dir": str(tmp_path / "none")})
    job = wait(keyed_server, r.json()["job_id"])
    assert (job["status"], job["error"]) == ("failed", ZERO_ROWS)
    assert not (tmp_path / "none" / "train.jsonl").exists()


def test_bad_submits_are_400_naming_the_field(keyed_server):
    cases = [({"template_id": "nope"}, "unknown template"),
             ({"template_id": "sft_qa_pairs"}, "inputs.pairs_text: is required"),
             ({"template_id": "self_instruct", "inputs": {"seeds": "x", "variants_per_seed": "lots"}}, "inputs.variants_per_seed"),
             ({"template_id": "sft_qa_pairs", "inputs": {"pairs_text": "Q: a\nA: b"}, "temperature": 9}, "temperature"),
             ({"template_id": "dpo_pref_pairs", "inputs": {"csv_text": "nonsense"}}, "inputs.csv_text"),
             ({"template_id": "tool_use_traces", "inputs": {"tools_json": "{}", "scenarios": "x"}}, "inputs.tools_json"),
             ([1, 2], "JSON object")]
    for body, needle in cases:
        r = submit(keyed_server, body)
        assert r.status_code == 400 and needle in r.json()["error"], (body, r.text)
    r = httpx.post(keyed_server.url + "/api/dataset/submit", content=b"{nope", headers=KEY, timeout=30)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]


def run_kiln(*args, env=None):
    return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_cli_builds_an_llm_dataset_from_a_keyed_server(keyed_server, tmp_path):
    out = tmp_path / "cli"
    p = run_kiln("dataset", "cot_synthesis", "--input", "questions=What is 2 plus 2?\nWhat is 3 plus 3?",
                 "--out", str(out), "--url", keyed_server.url, "--max-tokens", "32", "--temperature", "0",
                 env={"KILN_API_KEY": "sekrit"})
    assert p.returncode == 0, p.stderr
    assert "Wrote 2 rows" in p.stdout
    check_rows(rows_of(out / "train.jsonl"), "messages")
    p = run_kiln("dataset", "cot_synthesis", "--input", "questions=q", "--out", str(tmp_path / "bad"),
                 "--url", keyed_server.url, "--api-key", "wrong")
    assert p.returncode != 0 and "401" in p.stderr and "invalid or missing API key" in p.stderr, p.stderr


def test_jobs_cli_sends_the_key_and_shows_the_401(keyed_server, tmp_path):
    r = submit(keyed_server, {"template_id": "sft_qa_pairs", "inputs": {"pairs_text": "Q: a\nA: b"},
                              "output_dir": str(tmp_path / "listed")})
    wait(keyed_server, r.json()["job_id"])
    p = run_kiln("jobs", "--url", keyed_server.url, "--api-key", "sekrit", "list", "--json")
    assert p.returncode == 0, p.stderr
    assert any(j["kind"] == "dataset" for j in json.loads(p.stdout))
    p = run_kiln("jobs", "--url", keyed_server.url, "list", env={"KILN_API_KEY": "wrong"})
    assert p.returncode != 0 and "401" in p.stderr and "invalid or missing API key" in p.stderr, p.stderr
    p = run_kiln("jobs", "--url", keyed_server.url, "submit", "noop", "--follow", env={"KILN_API_KEY": "sekrit"})
    assert p.returncode == 0 and "[done]" in p.stdout, p.stdout + p.stderr
