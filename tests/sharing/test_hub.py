"""Sharing a model folder on the Hub (tested at its boundary): the upload, the model card, and loading the shared
tokenizer and the card's code from a folder or a Hub snapshot."""

import json
import os
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hf_vanilla_transformer.sharing.markdown import markdown_text
from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments, paper_learning_rate
from hf_vanilla_transformer.training.run import training_table
from support.files import write_lines
from support.hub import hub_snapshot, intercepted_hub
from support.models import SENTENCES, generate_text, letter_tokenizer, tiny_model
from support.processes import run_python

TOKENIZER_LOADS = {
    # no code of ours: the folder's tokenizer is a plain `tokenizers` one
    "plain": ("from transformers import PreTrainedTokenizerFast", "PreTrainedTokenizerFast.from_pretrained(source)"),
    "package": (
        "import hf_vanilla_transformer; from transformers import AutoTokenizer",
        "AutoTokenizer.from_pretrained(source)",
    ),
}


@pytest.mark.parametrize("how", TOKENIZER_LOADS)
def test_the_tokenizer_loads_with_no_prompt_and_no_warning(trained_run, model_and_tokenizer, tmp_path, how):
    """As the README and the model card say to load it, from a folder and from the Hub."""
    expected = model_and_tokenizer[1](SENTENCES)["input_ids"]
    repo_id, files = trained_run.commits[-1]
    hub_snapshot(tmp_path / "home", repo_id, files)
    imports, load = TOKENIZER_LOADS[how]
    result = run_python(
        f"""
        import json
        {imports}
        for source in ({str(trained_run.output)!r}, {repo_id!r}):
            tokenizer = {load}
            print(json.dumps(tokenizer({SENTENCES!r})["input_ids"]))
        """,
        tmp_path / "home",
        package_importable=how == "package",
    )
    assert [json.loads(line) for line in result.stdout.splitlines()] == [expected, expected]
    assert result.stderr == ""


def test_auto_tokenizer_alone_asks_to_run_the_model_code_where_the_package_is_missing(trained_run, tmp_path):
    """Why the README and the card load the tokenizer as above: transformers' AutoTokenizer first reads the
    folder's config.json through AutoConfig, which for a model type it does not know asks to run the folder's
    configuration code (and, refused, warns that it reads the config as a generic one). If this test fails,
    transformers changed that, and plain `AutoTokenizer.from_pretrained(folder)` can be documented."""
    result = run_python(
        f"""
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained({str(trained_run.output)!r})
        """,
        tmp_path / "home",
    )
    assert "Do you wish to run the custom code? [y/N]" in result.stdout
    assert "You are using a model of type `vanilla_transformer`" in result.stderr


# What `save_pretrained` writes for our model, with its code and card: in every pushed folder of ours
SAVED_MODEL = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "pipeline_translation.py",
    "README.md",
}


def test_run_translation_pushes_one_complete_folder(trained_run):
    assert len(trained_run.commits) == 1
    repo_id, files = trained_run.commits[0]
    assert repo_id == "someone/tiny-en-de"
    assert set(files) == SAVED_MODEL | {
        "all_results.json",
        "train_results.json",
        "eval_results.json",
        "predict_results.json",
        "generated_predictions.txt",
        "attention.png",
        "run_record.json",
    }
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("VanillaTransformerForConditionalGeneration")
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
    card = ModelCard(files["README.md"].decode())
    assert card.data.model_name == "someone/tiny-en-de" and "translation" in card.data.tags
    assert {(r.dataset_split, r.metric_type) for r in card.data.eval_results} == {
        ("validation", "bleu"),
        ("validation", "chrf"),
        ("test", "bleu"),
        ("test", "chrf"),
    }


def test_model_and_tokenizer_push_to_hub(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    commits = []
    with intercepted_hub(commits):
        model.push_to_hub("someone/pushed", token="hf_test")
        tokenizer.push_to_hub("someone/pushed", token="hf_test")
    (model_repo, model_files), (tokenizer_repo, tokenizer_files) = commits
    assert model_repo == tokenizer_repo == "someone/pushed"
    assert set(model_files) == {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "pipeline_translation.py",
        "README.md",
    }
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(tokenizer_files)
    tags = ModelCard(model_files["README.md"].decode()).data.tags
    assert {"translation", "vanilla-transformer"} <= set(tags)


def test_model_card_sections_and_metadata(trained_run):
    card = ModelCard.load(trained_run.output / "README.md")
    for heading in ("## Model", "## Intended uses and limits", "## Training", "## Evaluation", "## How to use"):
        assert heading in card.text
    assert "Attention Is All You Need" in card.text and "@inproceedings{vaswani2017attention" in card.text
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in card.text  # the sacreBLEU signature
    # the folder's card loads the folder; the one pushed loads the repository
    repo_id, files = trained_run.commits[-1]
    pushed = ModelCard(files["README.md"].decode())
    for text, name in ((card.text, str(trained_run.output)), (pushed.text, "someone/tiny-en-de")):
        assert f'AutoModelForSeq2SeqLM.from_pretrained("{name}", trust_remote_code=True)' in text
        assert f'PreTrainedTokenizerFast.from_pretrained("{name}")' in text
    assert repo_id == pushed.data.model_name == "someone/tiny-en-de"
    data = card.data.to_dict()
    assert data["language"] == ["en", "de"] and data["license"] == "apache-2.0"
    assert data["metrics"] == ["bleu", "chrf"] and data["pipeline_tag"] == "translation"
    assert data["model-index"][0]["results"][0]["task"]["type"] == "translation"


def test_the_card_shows_the_attention_of_its_example(trained_run, model_and_tokenizer):
    from matplotlib.image import imread

    card = ModelCard.load(trained_run.output / "README.md").text
    example, _ = json.JSONDecoder().raw_decode(card.split("tokenizer([", 1)[1])  # the code's literal
    assert f'![Encoder–decoder attention for "{markdown_text(example)}"](attention.png)' in card  # renders on the Hub
    picture = imread(trained_run.output / "attention.png")
    assert picture.ndim == 3 and picture.shape[0] > 100 and picture.shape[1] > 100
    _, files = trained_run.commits[0]
    assert files["attention.png"] == (trained_run.output / "attention.png").read_bytes()


def test_the_cards_code_translates_where_the_package_is_missing(trained_run, model_and_tokenizer, tmp_path):
    repo_id, files = trained_run.commits[-1]
    card = files["README.md"].decode()  # the card pushed, whose code loads the repository
    code = card.split("## How to use", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    example = code.split('tokenizer(["', 1)[1].split('"]', 1)[0]  # the first test sentence
    hub_snapshot(tmp_path / "home", repo_id, files)
    printed = run_python(code, tmp_path / "home").stdout.strip().splitlines()[-1]
    assert printed == str(generate_text(*model_and_tokenizer, [example]))


def test_the_training_table_names_equation_3_only_when_the_rate_came_from_it(tmp_path):
    def learning_rate_line(**settings):
        args = TranslationTrainingArguments(output_dir=str(tmp_path), warmup_steps=500, **settings)
        args.learning_rate = args.learning_rate or paper_learning_rate(256, 500, args.learning_rate_scale)
        table = training_table(args, 256, steps=10, training_pairs=29000, training_seconds=90.0, data="Multi30k")
        assert (table["steps"], table["training pairs"], table["training time"]) == (10, 29000, "1.5 minutes")
        return table["learning rate"]

    assert (
        learning_rate_line(learning_rate_scale=0.36)
        == "inverse_sqrt, peak 0.00101 (Equation 3 × 0.36), 500 warmup steps"
    )
    assert learning_rate_line(learning_rate=3e-4) == "inverse_sqrt, peak 0.0003, 500 warmup steps"


@pytest.fixture
def no_login(tmp_path, monkeypatch):
    """No saved login and no HF_TOKEN: huggingface_hub finds no token (its real lookup)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "home" / "token"))


@pytest.mark.parametrize(
    "hub, message",
    [
        ("offline", r"\(Token is required to call the /whoami-v2 endpoint, but no token found\."),
        ("unreachable", r"\(\[Errno 111\] Connection refused\)"),
    ],
)
def test_push_to_hub_without_a_login_or_a_hub_stops_before_training(tmp_path, no_login, monkeypatch, hub, message):
    import run_translation

    flags = []
    if hub == "unreachable":  # a token, but the Hub's address refuses connections: huggingface_hub's real request
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
        flags = ["--hub_token", "hf_not_a_token"]
    train = write_lines(tmp_path / "train.jsonl", ['{"translation": {"en": "A cat.", "de": "Eine Katze."}}'] * 20)
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        run_translation.main(
            [
                "--train_file",
                train,
                "--do_train",
                "--output_dir",
                str(output),
                "--report_to",
                "none",
                "--push_to_hub",
                "true",
                "--hub_model_id",
                "someone/model",
                *flags,
            ]
        )
    error = str(exit_info.value.code)
    assert error.startswith("run_translation.py: error: cannot push to the Hugging Face Hub (") and "\n" not in error
    assert re.search(message, error) and error.endswith("or push the finished folder later with vanilla-push-to-hub")
    assert not output.exists()


# What a finished folder holds besides its model files, none of which a push may upload: the Trainer's arguments (a
# pickle holding --hub_token) and state, a checkpoint, the optimizer and RNG states of a rotation a kill cut short,
# hidden files and folders (a git clone's among them), TensorBoard's events, an interrupted write's temporary files,
# a file beside the ONNX graphs that is not one, and a picture that is hidden
NOT_THE_MODEL = {
    "training_args.bin": b"hub_token=hf_secret",
    "trainer_state.json": b"{}",
    "checkpoint-5/optimizer.pt": b"optimizer",
    ".deleting-checkpoint-3/optimizer.pt": b"optimizer",
    ".deleting-checkpoint-3/rng_state.pth": b"rng",
    ".hidden/secret": b"secret",
    ".env": b"HF_TOKEN=hf_secret",
    ".git/config": b"[core]",
    "runs/Dec03_11-02-00/events.out.tfevents.1": b"events",
    "x.partial": b"half",
    ".config.json.k2j4.partial": b"half",
    ".preview.png": b"picture",
    "onnx/notes.txt": b"notes",
}

# The model files each finished folder holds: what the save or the export wrote, and in ours what a run adds
# (results, record, predictions, the card's picture) and an ONNX graph, the one folder the allow-list reaches into
MODEL_FILES = {
    "ours": SAVED_MODEL
    | {
        "all_results.json",
        "eval_results.json",
        "run_record.json",
        "generated_predictions.txt",
        "attention.png",
        "onnx/encoder_model.onnx",
    },
    "marian": {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    },
    "ctranslate2": {
        "model.bin",
        "shared_vocabulary.json",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    },
}


@pytest.fixture(scope="module")
def finished_folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny model folder of ours with a card and what a run adds, and its Marian and CTranslate2 exports, each
    with NOT_THE_MODEL beside its model files and a link named as a model file (vocab.json) to a file outside it."""
    from hf_vanilla_transformer.export.ctranslate2 import export as export_ctranslate2
    from hf_vanilla_transformer.export.marian import export as export_marian
    from hf_vanilla_transformer.sharing.card import render_model_card

    root = tmp_path_factory.mktemp("finished")
    model = tiny_model(vocab_size=14, decoder_attention_heads=4, max_position_embeddings=24)
    ours = root / "tiny-en-de"
    model.save_pretrained(ours)
    model.save_pretrained(ours / "checkpoint-5")
    letter_tokenizer().save_pretrained(ours)
    results = {"test": {"bleu": 1.0, "chrf": 2.0}}
    card = render_model_card(
        model,
        model_id=str(ours),
        source_lang="en",
        target_lang="de",
        results=results,
        training={},
        example_source="a b",
    )
    card.save(ours / "README.md")
    for name in ("all_results.json", "eval_results.json", "run_record.json"):
        (ours / name).write_text(json.dumps(results))
    (ours / "generated_predictions.txt").write_text("a b\n")
    (ours / "attention.png").write_bytes(b"\x89PNG")
    (ours / "onnx").mkdir()
    (ours / "onnx" / "encoder_model.onnx").write_bytes(b"graph")
    folders = {
        "ours": ours,
        "marian": Path(export_marian(str(ours), str(root / "tiny-marian"))),
        "ctranslate2": Path(export_ctranslate2(str(ours), str(root / "tiny-ct2"))),
    }
    (root / "outside.txt").write_bytes(b"a file of the user's, outside the folder")
    for folder in folders.values():
        for name, content in NOT_THE_MODEL.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)
        (folder / "vocab.json").symlink_to(root / "outside.txt")
    return folders


@pytest.mark.parametrize("kind", ["ours", "marian", "ctranslate2"])
def test_vanilla_push_to_hub_uploads_the_model_files_alone_in_one_commit(finished_folders, kind, capsys):
    """The commit, as huggingface_hub sends it, holds the model files and nothing else of the folder; a `.git/`
    folder in it (which huggingface_hub refuses to upload) is left out instead of failing the push."""
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    folder = finished_folders[kind]
    commits = []
    with intercepted_hub(commits):
        push_to_hub_main(["--model", str(folder), "--repo_id", "someone/tiny"])
    assert capsys.readouterr().out == f"Uploaded {folder} to https://huggingface.co/someone/tiny/commit/{'0' * 40}\n"
    ((repo_id, files),) = commits
    assert repo_id == "someone/tiny" and set(files) == MODEL_FILES[kind]
    for name in MODEL_FILES[kind] - {"README.md"}:
        assert files[name] == (folder / name).read_bytes()
    card = ModelCard(files["README.md"].decode())
    assert card.data.model_name == "someone/tiny"
    local_name = ModelCard.load(folder / "README.md").data.model_name
    code = card.text.split("## How to use", 1)[1]
    assert '"someone/tiny"' in code and f'"{local_name}"' not in code  # the card's code loads the repository


def dry_run(folder, capsys) -> tuple[str, list[tuple[str, str, int]], list[str]]:
    """What `vanilla-push-to-hub --dry_run` prints for `folder`: its first line, the files it would upload as (name,
    size, bytes), and the lines after them; nothing may be sent to the Hub, not even the login check."""
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    commits, requests = [], []
    with intercepted_hub(commits, requests):
        push_to_hub_main(["--model", str(folder), "--repo_id", "someone/tiny", "--dry_run"])
    assert commits == requests == []
    first, *lines = capsys.readouterr().out.splitlines()
    listed = [re.fullmatch(r"  (.+)  (\S+ \S+) \(([\d,]+) bytes\)", line) for line in lines]
    files = [(match[1], match[2], int(match[3].replace(",", ""))) for match in listed if match]
    return first, files, lines[len(files) :]


def test_vanilla_push_to_hub_dry_run_lists_the_upload_with_sizes_and_contacts_nothing(finished_folders, capsys):
    folder = finished_folders["ours"]
    first, files, (last,) = dry_run(folder, capsys)
    assert [name for name, _, _ in files] == sorted(MODEL_FILES["ours"])
    assert all(size == (folder / name).stat().st_size for name, _, size in files)
    assert ("onnx/encoder_model.onnx", "5 B", 5) in files  # b"graph"
    shown = {name: size for name, size, _ in files}
    assert shown["model.safetensors"] == f"{(folder / 'model.safetensors').stat().st_size / 1024:.1f} KiB"
    total = sum(size for _, _, size in files)
    assert first == (
        f"Would upload {len(MODEL_FILES['ours'])} files of {folder} to someone/tiny, "
        f"{total / 1024:.1f} KiB in all ({total:,} bytes):"
    )
    files, checkpoint = (
        sum(1 for path in where.rglob("*") if not path.is_dir()) for where in (folder, folder / "checkpoint-5")
    )
    assert last == (
        f"Left out {files - len(MODEL_FILES['ours'])} files: .config.json.k2j4.partial, .deleting-checkpoint-3/ (2), "
        f".env, .git/ (1), .hidden/ (1), .preview.png, checkpoint-5/ ({checkpoint}), onnx/ (1), runs/ (1), "
        "trainer_state.json, training_args.bin, vocab.json, x.partial"
    )


def test_vanilla_push_to_hub_refuses_a_token_flag_in_one_line(finished_folders, capsys):
    """A token on the command line shows in `ps` and in the shell's history: HF_TOKEN or the saved login instead."""
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    commits, requests = [], []
    for flags in (["--token", "hf_secret"], ["--token=hf_secret"], ["--token"]):
        with intercepted_hub(commits, requests), pytest.raises(SystemExit) as exit_info:
            push_to_hub_main(["--model", str(finished_folders["marian"]), "--repo_id", "someone/tiny", *flags])
        assert exit_info.value.code == 2 and capsys.readouterr().err == (
            "vanilla-push-to-hub: error: argument --token: a token on the command line shows in `ps` and the "
            "shell's history; set HF_TOKEN or log in with `hf auth login` (see --help)\n"
        )
    assert commits == requests == []


def test_vanilla_push_to_hub_sends_the_token_of_hf_token(finished_folders, no_login, monkeypatch, capsys):
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    commits, requests = [], []
    with intercepted_hub(commits, requests):
        push_to_hub_main(["--model", str(finished_folders["marian"]), "--repo_id", "someone/tiny"])
    assert len(commits) == 1
    paths = [request.url.path for request in requests]
    assert paths[:2] == ["/api/whoami-v2", "/api/repos/create"] and paths[-1] == "/api/models/someone/tiny/commit/main"
    assert {request.headers["authorization"] for request in requests} == {"Bearer hf_from_the_environment"}


def test_vanilla_push_to_hub_without_a_login_or_a_folder_is_one_line(finished_folders, tmp_path, no_login):
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    cases = [
        (finished_folders["marian"], "cannot push to the Hugging Face Hub (Token is required"),
        (tmp_path / "nothing", f"{tmp_path / 'nothing'}: not a model folder (no config.json)"),
    ]
    for folder, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            push_to_hub_main(["--model", str(folder), "--repo_id", "someone/tiny"])
        assert str(exit_info.value.code).startswith(f"vanilla-push-to-hub: error: {message}")


def test_vanilla_push_to_hub_dry_run_shows_a_sparse_file_by_its_size(tmp_path, capsys):
    """A file of 2 GiB that takes no room on disk (holes only) is listed at its size, which an upload would send."""
    (tmp_path / "config.json").write_text("{}")
    with open(tmp_path / "big.safetensors", "wb") as file:
        file.truncate(2 * 1024**3)
    first, files, _ = dry_run(tmp_path, capsys)
    assert files == [("big.safetensors", "2.0 GiB", 2 * 1024**3), ("config.json", "2 B", 2)]
    assert first.endswith(f"someone/tiny, 2.0 GiB in all ({2 * 1024**3 + 2:,} bytes):")


def test_vanilla_push_to_hub_judges_a_link_by_the_file_it_leads_to(tmp_path, capsys):
    """A link named as a model file is uploaded only where it leads to a model file of the folder (then as that
    file): not to a hidden file, a checkpoint's state or anything outside the folder (a secret of the user's)."""
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    folder = tmp_path / "model"
    (folder / "checkpoint-5").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "weights.safetensors").write_bytes(b"weights")
    (folder / ".env").write_bytes(b"HF_TOKEN=hf_secret_inside")
    (folder / "checkpoint-5" / "optimizer.pt").write_bytes(b"optimizer state")
    (tmp_path / ".env").write_bytes(b"HF_TOKEN=hf_secret_beside")
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id_rsa").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    links = {
        "model.safetensors": "weights.safetensors",  # a model file of the folder: uploaded, as that file
        "tokenizer.json": ".env",  # hidden
        "vocab.json": "checkpoint-5/optimizer.pt",  # a checkpoint's
        "special_tokens_map.json": "checkpoint-5",  # a folder
        "generation_config.json": "../.env",  # beside the folder
        "tokenizer_config.json": str(tmp_path / "home" / ".ssh" / "id_rsa"),  # anywhere
        "attention.png": "attention.png",  # a loop
    }
    for name, target in links.items():
        (folder / name).symlink_to(target)
    commits = []
    with intercepted_hub(commits):
        push_to_hub_main(["--model", str(folder), "--repo_id", "someone/tiny"])
    ((_, files),) = commits
    assert files == {"config.json": b"{}", "weights.safetensors": b"weights", "model.safetensors": b"weights"}
    assert capsys.readouterr().out.startswith(f"Uploaded {folder} to ")
    _, listed, (left_out,) = dry_run(folder, capsys)
    assert [name for name, _, _ in listed] == ["config.json", "model.safetensors", "weights.safetensors"]
    assert left_out == (
        "Left out 8 files: .env, attention.png, checkpoint-5/ (1), generation_config.json, special_tokens_map.json, "
        "tokenizer.json, tokenizer_config.json, vocab.json"
    )


# Names that would not stay one line of a listing, or would hide what they say: a line break that forges the
# listing's next line, a terminal's escape, a right-to-left override, a line separator, bytes that are not UTF-8
UNPRINTABLE_NAMES = [
    "model\nUploaded nothing.safetensors",
    "checkpoint-5/\x1b[2Kstate.pt",
    "model\u202eorsnetsefas.png",
    ".hidden\u2028file",
    os.fsdecode(b"weights-\xff.safetensors"),
]


def test_vanilla_push_to_hub_refuses_a_name_that_does_not_print_in_one_line(tmp_path, capsys):
    """Such a name anywhere in the folder, or in the folder's own, stops the command before it lists, logs in or
    uploads anything: one line that shows the name escaped, exit status 2."""
    from hf_vanilla_transformer.cli.push_to_hub import main as push_to_hub_main

    cases = [(tmp_path / str(number), name) for number, name in enumerate(UNPRINTABLE_NAMES)]
    cases.append((tmp_path / "a\nmodel", "config.json"))
    for folder, name in cases:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        (folder / name).write_bytes(b"x")
        for flags in ([], ["--dry_run"]):
            commits, requests = [], []
            with intercepted_hub(commits, requests), pytest.raises(SystemExit) as exit_info:
                push_to_hub_main(["--model", str(folder), "--repo_id", "someone/tiny", *flags])
            output = capsys.readouterr()
            assert exit_info.value.code == 2 and output.out == "" and commits == requests == [], name
            refused = name if name != "config.json" else str(folder)
            assert output.err.startswith("vanilla-push-to-hub: error: ") and output.err.count("\n") == 1, name
            assert repr(refused) in output.err and "holds the unprintable character" in output.err, name
