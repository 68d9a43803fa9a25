"""The lab pages (/lab) in Debian's headless Chromium, driven by playwright-core, against a
server started with --api-key: a wrong key shows the API's 401 message and the right one loads
the jobs; the dataset wizard writes Q/A pairs; the fine-tune wizard trains on them, shows the
loss, stops and saves, serves the adapter and answers one prompt with and without it; the
quantize wizard previews the fit and shows per-module sensitivity bars, and the status page
cancels that job. Screenshots of every page at 360 and 1280 px (KILN_SCREENSHOTS, else
tests/e2e/page/screenshots/); no page errors, no CSP violations, no sideways overflow at 360 px."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import Server

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "page", "lab_pages.mjs")
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium")
HAVE_DRIVER = os.path.isdir(os.path.join(HERE, "page", "node_modules", "playwright-core"))
KEY = "lab-sekrit"
PAGES = ["dataset", "finetune", "quantize", "status"]


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-lab-") as d:
        os.makedirs(os.path.join(d, "data"))
        yield d


@pytest.fixture(scope="module")
def lab_server(scratch):
    s = Server("--api-key", KEY, env={"KILN_DATA_DIR": os.path.join(scratch, "data")})
    yield s
    assert s.stop() == 0


@pytest.mark.skipif(not (CHROMIUM and shutil.which("node") and HAVE_DRIVER),
                    reason="needs chromium, node and playwright-core (scripts/e2e.sh installs it)")
def test_lab_pages_drive_every_wizard(lab_server, scratch):
    shots = os.environ.get("KILN_SCREENSHOTS") or os.path.join(HERE, "page", "screenshots")
    out = subprocess.run(["node", SCRIPT, lab_server.url, KEY, scratch], capture_output=True, text=True,
                         timeout=1500, env={**os.environ, "CHROMIUM": CHROMIUM, "KILN_SCREENSHOTS": shots})
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr
    r = json.loads(lines[-1])
    assert out.returncode == 0 and "error" not in r, (r.get("error"), r.get("errorArea"), out.stderr[-2000:])

    # The key: the API's own 401 message, then the jobs with the right key.
    assert r["expected401"]["status"] == 401
    assert r["wrongKeyError"] == r["expected401"]["message"] and r["keyHintShown"]
    assert r["jobsLoaded"] and r["errorAfterKey"] == ""
    assert r["redirect"] == "/lab#/status"
    assert "Weights" in r["memory"] and "Max safe context" in r["memory"]

    # Dataset → fine-tune → serve → side by side.
    assert r["dataset"]["format"] == "messages" and r["dataset"]["nTrain"] > 0 and r["dataset"]["rows"] > 0
    assert r["dataPrefilled"] == r["dataset"]["outputDir"]
    assert r["baseDefault"] == r["sourceDefault"]  # the served model comes first on both wizards
    ft = r["finetune"]
    assert r["pointsBeforeStop"] >= 2 and ft["points"] >= 2
    assert "stopped early" in ft["stopped"]
    assert os.path.isfile(os.path.join(ft["adapter"], "adapter_model.safetensors"))
    assert "Serving" in ft["served"] and ft["answerErrors"] == 0
    assert ft["answerAdapter"].strip() and ft["answerBase"].strip()

    # Quantize: preview, per-module bars, cancelled from the status page.
    q = r["quantize"]
    assert "iB of weights" in q["previewSize"] and "tokens" in q["previewCtx"]
    assert q["bars"] >= 1 and q["status"] == "cancelled"
    assert r["leaseAfterCancel"] == "none running"
    assert not os.path.exists(os.path.join(scratch, "mixed.gguf"))

    # Every page at both widths, nothing broken.
    for page in PAGES:
        for width in (360, 1280):
            assert os.path.getsize(os.path.join(shots, f"{page}-{width}.png")) > 0
        o = r["overflow"][page]
        assert o["scrollWidth"] <= o["innerWidth"] + 1, (page, o)
    assert not r["pageErrors"], r["pageErrors"]
    assert not r["cspViolations"], r["cspViolations"]
