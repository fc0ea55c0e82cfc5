"""demo/app.py as people use it: served on a loopback port, driven in a real headless Chromium, called through
gradio_client, and published as a Space (the slow tier, on a trained run); and against a visitor who would hold it
up or fill its disk (the quick tier, its page on a tiny model served in this process): a text too long is refused
before it is tokenized, a full queue refuses more requests, and the pictures do not stay on disk."""

import contextlib
import gc
import hashlib
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from matplotlib.image import imread

from hf_vanilla_transformer.inspection.pictures import SO_FAR_CHARACTERS, STEP_COLUMNS, WINNER
from hf_vanilla_transformer.training.data import read_translation_file
from support.browser import headless_chromium, served_demo
from support.models import SENTENCES, generate_text, letter_tokenizer, tiny_model
from support.paths import DEMO_APP, MULTI30K, REPO_ROOT
from support.processes import free_port

START_TIMEOUT, PAGE_TIMEOUT = 120, 90
# the tiny demo: its model's positions, the requests its queue holds, and a sentence its tokenizer holds on
POSITIONS, QUEUE_SIZE, HOLD = 24, 2, "j j j"
# the positions of a model with a long sentence's: those of our recipes' models
LONG_POSITIONS = 1024


def load_app():
    """demo/app.py as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location("demo_app", DEMO_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WatchedTokenizer:
    """A tokenizer that records the length of every text it is called on, and holds a call on HOLD until `release`
    is set (`holding` says one came), so that a test decides when the demo's one running request ends."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.lengths: list[int] = []
        self.holding, self.release = threading.Event(), threading.Event()

    def __call__(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        if text == HOLD:
            self.holding.set()
            self.release.wait(120)
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module")
def app():
    """demo/app.py as a module."""
    return load_app()


@contextlib.contextmanager
def served_page(app, model, tokenizer, written: Path, **options):
    """demo/app.py's page for `model` and `tokenizer` (`options`: translation_page's), served in this process on a
    free loopback port, gradio's folder (GRADIO_TEMP_DIR) and the temporary folder in `written`; its URL."""
    (written / "tmp").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(written / "gradio"))
        patch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
        patch.setattr(tempfile, "tempdir", str(written / "tmp"))
        demo = app.translation_page(model, tokenizer, "tiny", **options)
        port = free_port()
        app.launch(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            demo.close()


@pytest.fixture(scope="module")
def tiny_demo(app, tmp_path_factory):
    """demo/app.py's page for a tiny model and a WatchedTokenizer, served in this process, with a queue of QUEUE_SIZE
    and its pictures deleted once a second old, checked every second. Yields the URL, the tokenizer and the folder
    of what the server writes."""
    written = tmp_path_factory.mktemp("written")
    letters = letter_tokenizer()
    tokenizer = WatchedTokenizer(letters)
    model = tiny_model(vocab_size=len(letters), max_position_embeddings=POSITIONS)
    with served_page(app, model, tokenizer, written, queue_size=QUEUE_SIZE, delete_cache=(1, 1)) as url:
        yield url, tokenizer, written


def client_of(url: str):
    """A gradio_client Client that leaves the pictures on the server (their paths, not copies)."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False)


def files_in(folder: Path) -> list[Path]:
    """The files in `folder` and its subfolders."""
    return sorted(path for path in folder.rglob("*") if not path.is_dir())


def wait_for(condition, timeout: float = 60) -> bool:
    """Whether `condition()` came true within `timeout` seconds (a bound on a hang, not a measure of speed)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_text_over_the_character_limit_is_refused_before_it_is_tokenized(app, tiny_demo):
    """10 MB of text once took 12.4 s and 1.9 GB to tokenize before the token count refused it, every other request
    waiting: it is refused by its length in characters, the tokenizer never called on it."""
    from gradio_client.exceptions import AppError

    url, tokenizer, _ = tiny_demo
    client, limit = client_of(url), app.CHARACTERS_PER_POSITION * POSITIONS
    tokenizer.lengths.clear()
    for text in ["a " * 5_000_000, "a" * (limit + 1)]:
        with pytest.raises(AppError) as refusal:
            client.predict(text, api_name="/translate")
        assert str(refusal.value) == (
            f"source: {len(text):,} characters, more than the {limit:,} this demo reads "
            f"({app.CHARACTERS_PER_POSITION} for each of the model's {POSITIONS} positions)"
        )
    assert tokenizer.lengths == []
    # a text at the limit is read: one word here, two tokens with </s>, translated (tokenized twice: the attention
    # maps and the beam search's steps)
    steps = client.predict("a" * limit, api_name="/translate")[2]
    assert tokenizer.lengths == [limit, limit] and steps["data"]


def test_a_full_queue_refuses_more_requests(tiny_demo):
    """One request runs (held in the tokenizer), QUEUE_SIZE wait; one more is refused with gradio's queue-full
    error, and the others are all answered."""
    from gradio_client.utils import QueueError, Status

    url, tokenizer, _ = tiny_demo
    client = client_of(url)
    tokenizer.release.clear()
    running = client.submit(HOLD, api_name="/translate")
    try:
        assert tokenizer.holding.wait(60), "the first request did not start"
        waiting = []
        for _ in range(QUEUE_SIZE):
            waiting.append(client.submit("a b", api_name="/translate"))
            assert wait_for(lambda: waiting[-1].status().code == Status.IN_QUEUE), waiting[-1].status()
        with pytest.raises(QueueError, match="Queue is full"):
            client.submit("a b", api_name="/translate").result(timeout=60)
    finally:
        tokenizer.release.set()
    answers = [job.result(timeout=120) for job in [running, *waiting]]
    assert all(steps["data"] for _, _, steps in answers)


def test_the_longest_text_is_answered_with_a_picture_of_bounded_size(app, tmp_path):
    """The longest text the demo takes: a word for each of the model's positions but the one </s> takes. Its picture
    was 0.32 inch a token, 33,000 pixels wide here, and as tall for a translation as long: 22 GB for one request. It
    is at most 2,400 pixels a side, and the page says what it shows."""
    from gradio_client.exceptions import AppError

    letters = letter_tokenizer()
    model = tiny_model(vocab_size=len(letters), max_position_embeddings=LONG_POSITIONS)
    with served_page(app, model, letters, tmp_path) as url:
        client = client_of(url)
        longest = " ".join(["a"] * (LONG_POSITIONS - 1))
        translation, picture, steps = client.predict(longest, api_name="/translate")
        assert translation and steps["data"]
        height, width = imread(picture["path"]).shape[:2]
        assert width <= 2400 and height <= 2400
        with pytest.raises(AppError, match=f"{LONG_POSITIONS + 1} tokens, more than the model's {LONG_POSITIONS}"):
            client.predict(f"{longest} a", api_name="/translate")
        page = httpx.get(f"{url}config", timeout=60).json()
        assert app.PICTURE_NOTE in [component["props"].get("value") for component in page["components"]]


def test_a_request_leaves_no_figure_behind(tiny_demo):
    """matplotlib's figure is a cycle of objects that only a full garbage collection frees, which a server may not run
    for many requests: each held its picture's pixels meanwhile. Once a request is answered its figure is gone."""
    from matplotlib.figure import Figure

    def figures() -> set[int]:
        return {id(thing) for thing in gc.get_objects() if type(thing) is Figure}

    url, _, _ = tiny_demo
    before = figures()  # other tests' figures, if any
    assert client_of(url).predict("a b c", api_name="/translate")[1]
    assert figures() <= before


def test_a_queue_of_no_request_is_refused(app, capsys):
    with pytest.raises(SystemExit) as exit_status:
        app.main(["--model", "unused", "--queue_size", "0"])
    assert exit_status.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --queue_size 0 must be at least 1")


def test_requests_leave_no_picture_on_disk(tiny_demo):
    """Each picture is one file, gradio's, in its cache (GRADIO_TEMP_DIR), deleted once older than the cache's age:
    however many requests came, none is left a few seconds on; the demo writes no file of its own. Nor does an upload
    over the demo's limit (the page takes none; gradio's route takes any) get written."""
    url, _, written = tiny_demo
    client = client_of(url)
    sentences = ["a", "a b", "a b c", "b c d e"]
    pictures = [Path(client.predict(sentence, api_name="/translate")[1]["path"]) for sentence in sentences]
    assert len(set(pictures)) == len(sentences)  # a file each, where it is watched
    assert all(picture.is_relative_to(written / "gradio") for picture in pictures)
    upload = httpx.post(f"{url}gradio_api/upload", files={"files": ("big.bin", b"0" * 2048)}, timeout=60)
    assert upload.status_code == 413, upload.text
    wait_for(lambda: not files_in(written), timeout=30)
    assert files_in(written) == []


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
    # the hypothesis so far: whole, or its last SO_FAR_CHARACTERS after "…"
    shown = json.loads(winner[3].removeprefix("…"))
    assert f"{translation}</s>".endswith(shown.strip()) and len(shown) <= SO_FAR_CHARACTERS
    # the input contract of vanilla-translate and the pipeline: whitespace around a sentence is not translated,
    # an empty sentence gets an empty translation
    assert client.predict(f"  {SENTENCES[1]} ", api_name="/translate")[0] == translation
    empty, no_picture, _ = client.predict("  ", api_name="/translate")
    assert (empty, no_picture) == ("", None)


def test_concurrent_requests_each_get_the_sequential_answer(demo_url):
    """20 requests over loopback at once (5 sentences, each 4 times, shuffled, on 4 connections): every one is
    answered with the translation, picture and steps that the same sentence gets alone (bench.scale.bench_under_load
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


def test_the_served_demo_refuses_a_text_too_long_at_once(app, demo_url, trained_run):
    """The demo as served, on the trained run: 10 MB of text is refused by its characters, with the limit named
    (before, it was tokenized first: 12.4 s and 1.9 GB, then refused by its token count)."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError
    from transformers import AutoConfig

    positions = AutoConfig.from_pretrained(trained_run.output).max_position_embeddings
    limit = app.CHARACTERS_PER_POSITION * positions
    with pytest.raises(AppError, match=f"source: 10,000,000 characters, more than the {limit:,} this demo reads"):
        Client(demo_url, verbose=False).predict("a " * 5_000_000, api_name="/translate")


@pytest.mark.slow  # a Gradio server starting
def test_a_missing_model_is_one_clear_line(tmp_path):
    missing = tmp_path / "no-model"
    result = subprocess.run(
        [sys.executable, str(DEMO_APP), "--model", str(missing)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert str(missing) in result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_demo_folder_is_a_gradio_space():
    import gradio

    readme = (REPO_ROOT / "demo" / "README.md").read_text(encoding="utf-8")
    front_matter = yaml.safe_load(readme.split("---\n")[1])
    assert front_matter["sdk"] == "gradio" and front_matter["app_file"] == "app.py"
    assert front_matter["sdk_version"] == gradio.__version__  # the version the tests ran
    requirements = (REPO_ROOT / "demo" / "requirements.txt").read_text().split()
    assert requirements[0] == "hf-vanilla-transformer[demo]"
