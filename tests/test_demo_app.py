"""demo/app.py as people use it: served on a loopback port, driven in a real headless Chromium, called through
gradio_client, and published as a Space."""

import hashlib
import json
import random
import subprocess
import sys

import pytest
import yaml
from matplotlib.image import imread

from hf_vanilla_transformer.tools.visualize import STEP_COLUMNS, WINNER
from hf_vanilla_transformer.training.data import read_translation_file
from support.browser import headless_chromium, served_demo
from support.models import SENTENCES, generate_text
from support.paths import DEMO_APP, MULTI30K, REPO_ROOT
from support.processes import free_port

pytestmark = pytest.mark.slow  # a Gradio server on a trained run, Chromium

START_TIMEOUT, PAGE_TIMEOUT = 120, 90


@pytest.fixture(scope="module")
def demo_url(trained_run, tmp_path_factory):
    """The app serving the trained run's model on a free loopback port; stopped when the tests are done."""
    command = [sys.executable, str(DEMO_APP), "--model", str(trained_run.output), "--port", str(free_port())]
    with served_demo(command, tmp_path_factory.mktemp("demo") / "server.log", START_TIMEOUT) as url:
        yield url


@pytest.fixture(scope="module")
def expected(model_and_tokenizer):
    """The model's own translations (beam search, its generation config), as the page should show them."""
    return dict(zip(SENTENCES, generate_text(*model_and_tokenizer, SENTENCES), strict=True))


def test_a_person_translates_in_a_real_browser(demo_url, expected, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as browser:
        browser.get(demo_url)
        wait = WebDriverWait(browser, PAGE_TIMEOUT)
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#source textarea")).send_keys(SENTENCES[0])
        browser.find_element(By.CSS_SELECTOR, "button#translate").click()
        translation = wait.until(
            lambda b: b.find_element(By.CSS_SELECTOR, "#translation textarea").get_attribute("value")
        )
        assert translation == expected[SENTENCES[0]]
        picture = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#attention img"))
        wait.until(lambda b: b.execute_script("return arguments[0].complete && arguments[0].naturalWidth", picture))
        assert browser.execute_script("return arguments[0].naturalWidth", picture) > 100
        # the table's first rows (it scrolls; the gradio_client test reads it whole): step 1, the first token
        steps = browser.find_element(By.CSS_SELECTOR, "#steps").text.splitlines()
        step, beam, so_far, token = steps[steps.index("outcome") + 1 :][:4]  # step 1 extends no beam: no "from"
        assert step == beam == "1" and so_far == token and translation.startswith(json.loads(token))
        screenshot = tmp_path / "demo.png"
        assert browser.save_screenshot(str(screenshot)) and imread(screenshot).shape[1] == 1280


def test_the_api_answers_gradio_client(demo_url, expected):
    from gradio_client import Client

    client = Client(demo_url, verbose=False)
    translation, picture, steps = client.predict(SENTENCES[1], api_name="/translate")
    assert translation == expected[SENTENCES[1]]
    assert imread(picture).shape[0] > 100
    assert steps["headers"] == STEP_COLUMNS
    (winner,) = [row for row in steps["data"] if row[-1] == WINNER]  # the hypothesis generate() returned
    assert json.loads(winner[3]).removesuffix("</s>").strip() == translation
    # the input contract of vanilla-translate and the pipeline: whitespace around a sentence is not translated,
    # an empty sentence gets an empty translation
    assert client.predict(f"  {SENTENCES[1]} ", api_name="/translate")[0] == translation
    empty, no_picture, _ = client.predict("  ", api_name="/translate")
    assert (empty, no_picture) == ("", None)


def test_concurrent_requests_each_get_the_sequential_answer(demo_url):
    """20 requests over loopback at once (5 sentences, each 4 times, shuffled, on 4 connections): every one is
    answered with the translation, picture and steps that the same sentence gets alone (bench.bench_under_load
    sends 100)."""
    from gradio_client import Client

    sentences = [source for source, _ in read_translation_file(str(MULTI30K / "test.jsonl"), "en", "de")][:5]
    client = Client(demo_url, verbose=False)
    alone = {sentence: answer(client.predict(sentence, api_name="/translate")) for sentence in sentences}
    requests = sentences * 4
    random.Random(0).shuffle(requests)
    clients = [Client(demo_url, verbose=False) for _ in range(4)]  # several connections, as several people would
    jobs = [clients[i % 4].submit(sentence, api_name="/translate") for i, sentence in enumerate(requests)]
    answers = [answer(job.result(timeout=600)) for job in jobs]
    assert answers == [alone[sentence] for sentence in requests]


def answer(result) -> tuple:
    """What a person sees: the translation, the picture's pixels and the table of steps."""
    translation, picture, steps = result
    with open(picture, "rb") as file:
        return translation, hashlib.sha256(file.read()).hexdigest(), steps["data"]


def test_a_missing_model_is_one_clear_line(tmp_path):
    missing = tmp_path / "no-model"
    result = subprocess.run(
        [sys.executable, str(DEMO_APP), "--model", str(missing)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert str(missing) in result.stderr.strip().splitlines()[-1]


def test_the_demo_folder_is_a_gradio_space():
    import gradio

    readme = (REPO_ROOT / "demo" / "README.md").read_text(encoding="utf-8")
    front_matter = yaml.safe_load(readme.split("---\n")[1])
    assert front_matter["sdk"] == "gradio" and front_matter["app_file"] == "app.py"
    assert front_matter["sdk_version"] == gradio.__version__  # the version the tests ran
    requirements = (REPO_ROOT / "demo" / "requirements.txt").read_text().split()
    assert requirements[0] == "hf-vanilla-transformer[demo]"
