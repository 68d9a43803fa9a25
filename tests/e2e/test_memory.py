"""KV schemes and memory admission through the real server: a budget that leaves a small safe
context refuses a longer request with the spec's 400 before any prefill; a budget that cannot
hold the model refuses to load with the numbers; /stats shows the scheme per layer."""

import json
import subprocess

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import anthropic
import openai
import pytest

from conftest import KILN, MODEL, Server


def fit(*args):
    out = subprocess.run(
        [KILN, "fit", MODEL, "--json", *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def budget_for_safe_context(target, *kv):
    """A --memory-budget (GB) whose max safe context is about `target` tokens."""
    at = fit("--memory-budget", "100", *kv, "--ctx", str(target))
    # The budget must also cover loading; the safe context is then set by the steady state.
    need = max(at["total_bytes"], at["load_peak_bytes"])
    return need / 1e9, at


@pytest.fixture(scope="module")
def budget_server():
    gb, _ = budget_for_safe_context(600, "--kv-quant", "4")
    s = Server("--memory-budget", f"{gb:.9f}", "--ctx", "2048", "--kv-quant", "4")
    yield s
    s.stop()


def test_over_budget_request_gets_400_before_any_prefill(budget_server):
    stats = httpx.get(budget_server.url + "/stats").json()
    safe = stats["admission"]["max_safe_context"]
    assert 300 < safe < 2048, stats["admission"]
    assert stats["admission"]["budget_source"] == "--memory-budget"
    before = stats["tokens"]["prompt"]
    oai = openai.OpenAI(base_url=budget_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=safe,
        )
    err = e.value.body
    assert err["type"] == "memory_admission", err
    assert err["code"] == "context_over_budget", err
    assert f"caps safe context at {safe}" in err["message"], err
    # Anthropic clients get the same refusal in their shape.
    anth = anthropic.Anthropic(base_url=budget_server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        anth.messages.create(
            model=MODEL, max_tokens=safe, messages=[{"role": "user", "content": "Hi"}]
        )
    assert "safe context" in str(e.value)
    after = httpx.get(budget_server.url + "/stats").json()
    assert after["tokens"]["prompt"] == before, "a refused request computed nothing"
    assert after["requests"]["finished"] == stats["requests"]["finished"]
    # Within the budget the same server answers, and a default max_tokens shrinks to fit.
    ok = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    assert ok.usage.completion_tokens <= 8


def test_stats_show_the_scheme_per_layer_and_conversions(budget_server):
    oai = openai.OpenAI(base_url=budget_server.url + "/v1", api_key="x", max_retries=0)
    oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=8
    )
    kv = httpx.get(budget_server.url + "/stats").json()["kv"]
    assert kv["scheme"] == "kv4"
    assert kv["label"] == "uniform-kv4"
    assert kv["start"] == 0
    assert len(kv["layers"]) == 30 and set(kv["layers"]) == {"affine4-g64"}
    # The last conversation converted after its first prefill chunk.
    assert set(kv["current"]) == {"affine4-g64"}
    assert kv["conversions"] >= 30
    assert kv["bytes_per_token"] == 30 * 216


def test_a_model_that_cannot_fit_is_refused_at_load_with_the_numbers():
    at = fit("--ctx", "16", "--memory-budget", "100")
    too_small = (at["weights_bytes"] + at["runtime_overhead_bytes"]) / 1e9
    out = subprocess.run(
        [KILN, "serve", MODEL, "--port", "0", "--memory-budget", f"{too_small:.6f}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "does not fit the memory budget" in out.stderr, out.stderr
    assert "weights 0.097 GB" in out.stderr, out.stderr


def test_kv_flags_are_validated_with_clear_messages():
    for args, msg in [
        (["--kv-quant", "5"], "must be one of 4 or 8"),
        (["--kv-quant", "4", "--kv-group-size", "48"], "group size must be one of"),
        (["--kv-group-size", "32"], "applies only to --kv-quant 4|8"),
        (["--kv-quant", "turbo", "--turbo-v-bits", "7"], "TurboQuant v bits"),
        (["--kv-quant", "config"], "no kv_config.json"),
        (["--kv-quant", "4", "--quantized-kv-start", "-3"], "nonnegative integer"),
        (["--kv-quant", "4", "--kv-group-size", "128"], "layer 0"),
    ]:
        out = subprocess.run(
            [KILN, "serve", MODEL, "--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode != 0, args
        assert msg in out.stderr, (args, out.stderr)
