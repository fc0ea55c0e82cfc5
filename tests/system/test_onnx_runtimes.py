"""The ONNX export of trained models (English→German and English→Chinese) in the runtimes that load it: ONNX Runtime
from Python decodes as our `generate(num_beams=1)` does, transformers.js in Node as ONNX Runtime in Python, and the
translation page translates in a real Chromium, offline, with its picture of the cross-attention."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.image import imread

from hf_vanilla_transformer.engines.generate import ModelTranslator
from hf_vanilla_transformer.engines.onnx import OnnxTranslator
from hf_vanilla_transformer.export.onnx import export
from hf_vanilla_transformer.training.data import read_translation_file
from hf_vanilla_transformer.translation.lines import translate_lines
from support.browser import headless_chromium
from support.paths import MULTI30K, REPO_ROOT, TATOEBA_EN_ZH
from support.processes import free_port

pytestmark = pytest.mark.slow  # trained runs, Node, Chromium

WEB = REPO_ROOT / "demo" / "web"
TEST_SETS = {"trained_run": (MULTI30K / "test.jsonl", "de"), "chinese_run": (TATOEBA_EN_ZH / "test.jsonl", "zh")}
SENTENCES = 200


@pytest.fixture(scope="module", params=list(TEST_SETS))
def exported(request, tmp_path_factory):
    """A trained run, its ONNX export, the first test sources and ONNX Runtime's float32 translations of them."""
    run = request.getfixturevalue(request.param)
    folder = tmp_path_factory.mktemp("onnx") / "model"
    export(str(run.output), str(folder))
    path, target = TEST_SETS[request.param]
    sources = [source for source, _ in read_translation_file(str(path), "en", target)][:SENTENCES]
    return run, folder, sources, OnnxTranslator(str(folder)).translate(sources, batch_size=32)


def test_onnx_runtime_translates_as_generate_greedy(exported):
    run, _, sources, translations = exported
    expected = translate_lines(ModelTranslator(str(run.output), "cpu"), sources, 32, {"num_beams": 1}, False)
    same = sum(ours == theirs for ours, theirs in zip(expected, translations, strict=True))
    assert same >= 0.99 * len(sources), f"{same} of {len(sources)} the same"


def test_transformers_js_in_node_translates_as_onnx_runtime_in_python(exported):
    _, folder, sources, translations = exported
    node = shutil.which("node")
    assert node, "the slow tier needs Node.js (20 or later) for transformers.js; setup.sh installs its packages"
    assert (WEB / "node_modules" / "@huggingface" / "transformers").is_dir(), "run setup.sh: demo/web has no packages"
    result = subprocess.run(
        [node, str(WEB / "translate.mjs"), str(folder), "fp32"],
        input="\n".join(sources) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == translations


def test_the_page_translates_in_a_browser_offline_and_draws_the_cross_attention(exported, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _, folder, sources, translations = exported
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as output:
        server = subprocess.Popen(
            [sys.executable, str(WEB / "serve.py"), "--model", str(folder), "--port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        with headless_chromium(offline=True) as browser:
            wait = WebDriverWait(browser, 120)
            wait.until(lambda _: "Serving" in log.read_text() or server.poll() is not None)
            assert server.poll() is None, log.read_text()
            browser.get(f"http://127.0.0.1:{port}/")
            wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
            browser.find_element(By.ID, "source").send_keys(sources[0])  # as typed: a translation per pause
            wait.until(lambda b: b.find_element(By.ID, "status").text == "Translated.")
            assert browser.find_element(By.ID, "translation").text == translations[0]
            sources_drawn = browser.find_elements(By.CSS_SELECTOR, "#attention .source")
            targets_drawn = browser.find_elements(By.CSS_SELECTOR, "#attention .target")
            weights = [
                float(cell.get_attribute("data-weight"))
                for cell in browser.find_elements(By.CSS_SELECTOR, "#attention .weight")
            ]
            assert sources_drawn[-1].text == "</s>" and targets_drawn[-1].text == "</s>"
            rows = np.array(weights).reshape(len(targets_drawn), len(sources_drawn))
            np.testing.assert_allclose(rows.sum(1), 1, atol=1e-4)  # each output token's attention over the source
            errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
            assert not errors, errors
            screenshot = tmp_path / "page.png"
            assert browser.save_screenshot(str(screenshot))
        picture = imread(screenshot)[..., :3]
        tinted = picture[..., 2] - picture[..., 0] > 0.02  # the grid's cells, blue as deep as their weight
        assert picture.shape[1] == 1280 and tinted.sum() > 50 * rows.size, (tinted.sum(), rows.shape)
        served = log.read_text()
        assert "/models/model/onnx/decoder_model_merged.onnx" in served and "transformers.js" in served
    finally:
        server.terminate()
        server.wait(timeout=30)
