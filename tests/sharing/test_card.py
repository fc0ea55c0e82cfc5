"""Each model card's claims, read back against its folder's files: the library, the decoding, and the code, which
runs as written (where the card says it needs no package of ours, in a Python where it cannot be imported), and
stays the same code whatever the example sentence and the model's path hold."""

import ast
import io
import json
import re
import shlex
import tokenize
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from hypothesis import assume, given
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

from hf_vanilla_transformer.formats import RUN_RECORD
from hf_vanilla_transformer.sharing.card import render_model_card, write_export_card, write_model_card
from hf_vanilla_transformer.sharing.markdown import code_literal, fenced_block, inline_code, markdown_text
from support.files import write_dataset
from support.hostile import FUZZ_SETTINGS
from support.models import generate_text, letter_tokenizer, tiny_model
from support.runs import TINY_MODEL_RUN

EXAMPLE = "a b c"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A tiny model folder of ours with its card (decoding beam 3, length penalty 1.0: not the paper's), named as a
    run names it (`runs/NAME`, from the folder it started in, `root`), and its CTranslate2 and Marian exports."""
    from hf_vanilla_transformer.export.ctranslate2 import export as export_ctranslate2
    from hf_vanilla_transformer.export.marian import export as export_marian

    root = tmp_path_factory.mktemp("cards")
    # one head count, as CTranslate2 needs; 24 positions, so that the untrained model's translations end soon
    model = tiny_model(vocab_size=14, decoder_attention_heads=4, max_position_embeddings=24)
    model.generation_config.update(num_beams=3, length_penalty=1.0)
    ours = root / "runs" / "tiny-en-de"
    model.save_pretrained(ours)
    letter_tokenizer().save_pretrained(ours)
    # what a run records (training/run.py), from which the card is written
    record = {
        "model_id": "runs/tiny-en-de",
        "source_lang": "en",
        "target_lang": "de",
        "dataset_id": None,
        "dataset_name": None,
        "training": {"steps": 1, "hardware": "a test"},
        "scores": {"test": {"bleu": 1.5, "chrf": 20.0, "samples": 3}},
        "example": {"source": EXAMPLE, "translation": "d e f"},
    }
    (ours / RUN_RECORD).write_text(json.dumps(record))
    write_model_card(str(ours))  # the model and tokenizer loaded from the folder
    return {
        "root": root,
        "ours": ours,
        "ctranslate2": Path(export_ctranslate2(str(ours), str(root / "ct2"))),
        "marian": Path(export_marian(str(ours), str(root / "marian"))),
    }


def test_the_card_is_written_from_the_runs_record_and_the_folder(folders):
    card = ModelCard.load(folders["ours"] / "README.md")
    assert card.data.model_name == "runs/tiny-en-de" and card.data.language == ["en", "de"]
    assert [(result.dataset_split, result.metric_type, result.metric_value) for result in card.data.eval_results] == [
        ("test", "bleu", 1.5),
        ("test", "chrf", 20.0),
    ]
    assert "- hardware: a test" in card.text and '# [{"translation_text": "d e f"}]' in card.text
    assert "![" in card.text and (folders["ours"] / "attention.png").is_file()  # the example's attention, drawn


def names_model(model_code: str, pipeline_code: str, model_id: str) -> bool:
    """Whether a card's model and pipeline snippets load `model_id` (a folder, or a repository once pushed)."""
    return f'.from_pretrained("{model_id}"' in model_code and f'model="{model_id}"' in pipeline_code


def how_to_use(card: ModelCard) -> str:
    return card.text.split("## How to use", 1)[1].split("\n## ", 1)[0]


def python_blocks(text: str) -> list[str]:
    return [code for language, code in code_blocks(text) if language == "python"]


def our_translation(folder, **decoding) -> str:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    tokenizer = letter_tokenizer()
    with torch.no_grad():
        output = model.generate(**tokenizer([EXAMPLE], return_tensors="pt"), **decoding)
    return str(tokenizer.batch_decode(output, skip_special_tokens=True))


@pytest.mark.parametrize(
    "kind, library", [("ours", "transformers"), ("ctranslate2", "ctranslate2"), ("marian", "transformers")]
)
def test_each_card_names_its_library_and_decodes_as_its_generation_config(folders, kind, library):
    folder = folders[kind]
    card = ModelCard.load(f"{folder}/README.md")
    generation = json.loads((folder / "generation_config.json").read_text())
    assert card.data.library_name == library
    assert card.data.to_dict()["widget"] == [{"text": EXAMPLE}]
    usage = " ".join(how_to_use(card).split())
    beams, penalty = re.search(r"beam size (\d+), length penalty ([\d.]+)", usage).groups()
    assert (int(beams), float(penalty)) == (generation["num_beams"], generation["length_penalty"]) == (3, 1.0)
    limit = re.search(r"at most (the source length \+ (\d+) tokens|`max_length` = (\d+) tokens)", usage)
    if "max_new_tokens_over_source" in generation:
        assert int(limit[2]) == generation["max_new_tokens_over_source"]
    else:
        assert int(limit[3]) == generation["max_length"]
    assert EXAMPLE in usage


def run_code(code: str, capsys) -> str:
    """What `code` prints last, run here. The Marian card's code also runs in a Python without our package
    (export/test_export_marian.py), as does our card's model code (test_hub.py, on a trained model)."""
    capsys.readouterr()
    exec(code, {})
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_ctranslate2_cards_code_translates_as_vanilla_translate(folders, capsys):
    from hf_vanilla_transformer.engines.ctranslate2 import CTranslate2Translator

    (code,) = python_blocks(how_to_use(ModelCard.load(f"{folders['ctranslate2']}/README.md")))
    assert "hf_vanilla_transformer" not in code
    assert (
        run_code(code, capsys) == CTranslate2Translator(str(folders["ctranslate2"]), "cpu").translate([EXAMPLE], 1)[0]
    )


def test_our_cards_code_runs_and_the_pipeline_needs_what_the_card_says(folders, capsys, monkeypatch):
    """From the folder the run started in (the README's quick start: the repository root), with the Hub unreachable
    (conftest.py), so that a name taken for a Hub id fails at once."""
    from transformers import pipeline

    import hf_vanilla_transformer

    model_code, pipeline_code = python_blocks(how_to_use(ModelCard.load(f"{folders['ours']}/README.md")))
    assert names_model(model_code, pipeline_code, "runs/tiny-en-de")
    monkeypatch.chdir(folders["root"])
    expected = our_translation(folders["ours"])
    assert run_code(model_code, capsys) == expected
    printed = run_code(pipeline_code, capsys)
    assert printed == str([{"translation_text": eval(expected)[0]}])
    # "the pipeline still asks for trust_remote_code unless given as pipeline_class=...": both halves true
    with pytest.raises(ValueError, match="requires you to execute the code in the pipeline file"):
        pipeline("translation", model=str(folders["ours"]))
    translator = pipeline(
        "translation", model=str(folders["ours"]), pipeline_class=hf_vanilla_transformer.TranslationPipeline
    )
    assert str(translator(EXAMPLE)) == printed


@pytest.mark.slow  # a run of run_translation.py, if of two steps
def test_a_runs_card_loads_its_folder_from_where_the_run_started_and_a_push_names_the_repository(
    tmp_path, monkeypatch, capsys
):
    """run_translation.py as the README's quick start runs it: from the repository root (here `tmp_path`) into
    `runs/NAME`. The card's code, run from there with the Hub unreachable (conftest.py), loads that folder, where
    the folder's bare name would be taken for a Hub id; pushed, the card names the repository."""
    import run_translation
    from hf_vanilla_transformer.sharing.hub import card_for

    monkeypatch.chdir(tmp_path)
    rows = [
        {"en": f"The {en} is {state}.", "de": f"Die {de} ist {zustand}."}
        for en, de in [("cat", "Katze"), ("dog", "Hund"), ("bird", "Vogel")]
        for state, zustand in [("small", "klein"), ("here", "hier"), ("old", "alt")]
    ]
    write_dataset(tmp_path / "data", {"train": rows, "validation": rows[:3], "test": rows[3:6]})
    run_translation.main(
        [
            *TINY_MODEL_RUN,
            "--dataset_name",
            "data",
            "--vocab_size",
            "300",
            "--max_steps",
            "2",
            "--warmup_steps",
            "1",
            "--output_dir",
            "runs/tiny-en-de",
        ]
    )
    card = ModelCard.load("runs/tiny-en-de/README.md")
    model_code, pipeline_code = python_blocks(how_to_use(card))
    assert names_model(model_code, pipeline_code, "runs/tiny-en-de")
    printed = run_code(model_code, capsys)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "runs" / "tiny-en-de")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "runs" / "tiny-en-de")
    example = model_code.split('tokenizer(["', 1)[1].split('"]', 1)[0]
    assert printed == str(generate_text(model, tokenizer, [example]))
    assert run_code(pipeline_code, capsys) == str([{"translation_text": eval(printed)[0]}])
    pushed = ModelCard(card_for(Path("runs/tiny-en-de/README.md"), "someone/tiny-en-de").decode())
    model_code, pipeline_code = python_blocks(how_to_use(pushed))
    assert names_model(model_code, pipeline_code, "someone/tiny-en-de")  # the text only: the Hub is offline here
    assert "runs/tiny-en-de" not in how_to_use(pushed)


# Example sentences that broke a card's code out of its string literals (the first test-set source is the example)
HOSTILE = [
    'He said "hello".',
    'a backslash before a quote: \\" and on',
    "a trailing backslash \\",
    'three quotes """ in a row',
    "three single quotes ''' in a row",
    "two\nlines",
    # closes the export cards' literal, or as `\\"` the main card's (which escaped `"`, not `\\`), and runs a command
    '"]); __import__("os").system("touch PWNED")  #',
    "\\\"]); __import__('os').system('touch PWNED')  #",
    "code `spans`, a fence ``` and\n```\na line of its own",
    "中文句子, an emoji 😀 and a line\u2028separator",
]
PLAIN = {"EXAMPLE": EXAMPLE, "MODEL": "runs/tiny-en-de", "DATA": "data/multi30k", "SOURCE": "English"}
# a folder's path, as a run's card names it: quotes, a backslash, a shell substitution, non-ASCII
HOSTILE_MODEL_ID = 'runs/it\'s a "tiny" \\ $(touch PWNED) 模型'


@given(st.text())
def test_a_code_literal_is_the_string_in_python_and_in_json_on_one_printable_line(text):
    literal = code_literal(text)
    assert ast.literal_eval(literal) == json.loads(literal) == text  # JSON's strings are JavaScript's
    assert all(character.isprintable() or ord(character) > 0xFFFF for character in literal)


@pytest.fixture(scope="module")
def write_cards(tmp_path_factory):
    """`write_cards(sentence, model_id, data, source)`: the cards of a tiny model's folder with `sentence` as its
    example (and as the example's translation), trained on `data` (its name and the training list's) to translate
    `source` (a language's name), {kind: card}: ours (render_model_card) and those of its CTranslate2, Marian and
    ONNX exports, written as each export writes its card but with no export, so that they take milliseconds."""
    from hf_vanilla_transformer.export import ctranslate2, marian, onnx

    model = tiny_model(vocab_size=14)
    generation = GenerationConfig(num_beams=3, length_penalty=1.0, max_length=24)
    usages = {
        "ctranslate2": ctranslate2.usage(generation, "int8"),
        "marian": marian.usage(generation.to_dict(), 50),
        "onnx": onnx.usage(50),
    }

    def write(
        sentence: str, model_id: str, data: str = PLAIN["DATA"], source: str = PLAIN["SOURCE"]
    ) -> dict[str, ModelCard]:
        root = tmp_path_factory.mktemp("card")
        (root / "ours").mkdir()
        (root / "ours" / "attention.png").write_bytes(b"a picture")
        results = {"test": {"bleu": 1.0, "chrf": 2.0, "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nc:6"}}
        card = render_model_card(
            model,
            model_id=model_id,
            source_lang=source,
            target_lang="de",
            results=results,
            training={"data": data, "steps": 1},
            dataset_name=data,
            example_source=sentence,
            example_translation=sentence,
            attention_picture="attention.png",
        )
        card.save(root / "ours" / "README.md")
        for kind, usage in usages.items():
            (root / kind).mkdir()
            write_export_card(str(root / "ours"), str(root / kind), model_id, kind, [kind], usage)
            assert (root / kind / "attention.png").is_file()  # the picture found in the card, and copied
        return {kind: ModelCard.load(root / kind / "README.md") for kind in ("ours", *usages)}

    return write


def code_blocks(text: str) -> list[tuple[str, str]]:
    """A card's fenced code blocks, (language, code)."""
    return [(token.info, token.content) for token in MARKDOWN.parse(text) if token.type == "fence"]


def json_shape(text: str, names: dict[str, str]) -> str:
    """`text` with each double-quoted string in JSON's syntax (JavaScript's too) whose value is one of `names`'
    values in the place of its name."""

    def named(literal: re.Match) -> str:
        try:
            value = json.loads(literal[0])
        except json.JSONDecodeError:
            return literal[0]
        return next((name for name, named_value in names.items() if named_value == value), literal[0])

    return re.sub(r'"(?:[^"\\]|\\.)*"', named, text)


def python_shape(code: str, names: dict[str, str]) -> str:
    """The syntax tree of `code`, each string constant equal to one of `names`' values in the place of its name,
    and its comments (whose JSON strings show what the code prints) likewise."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = next((name for name, value in names.items() if node.value == value), node.value)
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    comments = [json_shape(token.string, names) for token in tokens if token.type == tokenize.COMMENT]
    return "\n".join([ast.dump(tree), *comments])


def shell_shape(code: str, names: dict[str, str]) -> str:
    """The shell words of `code`, each equal to one of `names`' values in the place of its name."""
    inverse = {value: name for name, value in names.items()}
    return " ".join(inverse.get(word, repr(word)) for word in shlex.split(code, comments=True))


SHAPES = {"python": python_shape, "bash": shell_shape, "js": json_shape, "bibtex": lambda code, names: code}


@pytest.fixture(scope="module")
def plain_cards(write_cards) -> dict[str, ModelCard]:
    return write_cards(PLAIN["EXAMPLE"], PLAIN["MODEL"])


@pytest.mark.parametrize("sentence", HOSTILE)
def test_a_hostile_example_sentence_stays_one_string_in_every_cards_code(write_cards, plain_cards, sentence):
    """Each card's code blocks are the code they are for a plain sentence and model id, token for token, with the
    sentence and the model id as whole strings where those were: Python's syntax tree, the shell's words,
    JavaScript's JSON strings. The widget (YAML) keeps the sentence, and the picture's description shows it."""
    hostile = {"EXAMPLE": sentence, "MODEL": HOSTILE_MODEL_ID}
    for kind, card in write_cards(sentence, HOSTILE_MODEL_ID).items():
        assert card.data.to_dict()["widget"] == [{"text": sentence}], kind
        blocks, plain_blocks = code_blocks(card.text), code_blocks(plain_cards[kind].text)
        assert [language for language, _ in blocks] == [language for language, _ in plain_blocks], kind
        shapes = [SHAPES[language](code, hostile) for language, code in blocks]
        assert shapes == [SHAPES[language](code, PLAIN) for language, code in plain_blocks], kind
        assert "EXAMPLE" in "".join(shapes) and "MODEL" in "".join(shapes), kind
        (description,) = re.findall(r"!\[((?:[^\]\\\n]|\\.)*)\]\(attention\.png\)", card.text)
        assert re.sub(r"\\(.)", r"\1", description) == f'Encoder–decoder attention for "{" ".join(sentence.split())}"'


# Folder names (and so Hub ids, data sets' and languages' names) that broke a card's Markdown: a line break that
# starts a heading or a code block, backticks (one, and runs) that end a code span, fences of both kinds, HTML,
# emphasis, links, a table's cell, an entity, a shell substitution, quotes and backslashes, a line separator, Chinese
HOSTILE_NAMES = [
    "tiny\n# A heading\n```bash\ntouch PWNED\n```\nthe end",
    "a `tick` and a run `` of ``` them `",
    "`` a name in backticks ``",
    "a fence\n~~~\nand\n````\nthe other",
    "# not a heading #",
    "1. not a list",
    "- not a list either",
    "<script>alert(1)<img src=x onerror=alert(1)>",  # no "/": the title is the path's last part
    "*emphasis* _too_ [a link](https:x.y) ![a picture](x.png) | a cell | &amp; ~~struck~~ $x$ \\",
    "$(touch PWNED) 'quotes' \"double\" \\ back\\slashes\\",
    "a line\u2028separator and\u2029another",
    "中文模型 «名»",
]


def names_of(name: str) -> dict[str, str]:
    """The names a card is written with, `name` in each: the model's path, its title (the path's last part), the
    data set and the source language; the example is plain."""
    return {"EXAMPLE": EXAMPLE, "MODEL": f"runs/{name}", "TITLE": name, "DATA": f"data/{name}", "SOURCE": f"en {name}"}


PLAIN_NAMES = PLAIN | {"TITLE": "tiny-en-de"}


# CommonMark, with the tables and strikethrough of GitHub's Markdown (which the Hub renders)
MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def markdown_shape(text: str, names: dict[str, str]) -> list:
    """`text` as a Markdown renderer reads it: each block's kind, each line of inline content's kinds and the text
    it shows, each code span's JSON strings and each code block's shape (SHAPES), with `names`' values in the place
    of their names (in the text shown, their whitespace runs shown as one space)."""
    shown = sorted(((" ".join(value.split()), name) for name, value in names.items()), key=lambda pair: -len(pair[0]))

    def text_shape(text: str) -> str:
        for value, name in shown:
            text = text.replace(value, name)
        return text

    def inline_shape(children) -> list:
        shape, text = [], ""
        for child in children:
            if child.type == "text":
                text += child.content
                continue
            shape += [("text", text_shape(text))] if text else []
            text = ""
            if child.type == "code_inline":
                shape.append((child.type, json_shape(child.content, names)))
            elif child.type == "image":
                shape.append((child.type, child.attrs["src"], text_shape("".join(c.content for c in child.children))))
            else:
                shape.append((child.type, child.content))
        return shape + ([("text", text_shape(text))] if text else [])

    return [
        (token.type, token.info, SHAPES[token.info](token.content, names))
        if token.type == "fence"
        else inline_shape(token.children)
        if token.type == "inline"
        else (token.type, token.tag)
        for token in MARKDOWN.parse(text)
    ]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_name_is_shown_as_written_in_every_cards_title_prose_and_code(write_cards, plain_cards, name):
    """A folder's name, a data set's, a language's, whatever Markdown, HTML or shell they hold, leave each card's
    Markdown as it is with plain names, block for block: shown as written (on one line) in the title, the prose and
    the lists, one string in the code spans and the code blocks."""
    names = names_of(name)
    for kind, card in write_cards(EXAMPLE, names["MODEL"], names["DATA"], names["SOURCE"]).items():
        shape = markdown_shape(card.text, names)
        assert shape == markdown_shape(plain_cards[kind].text, PLAIN_NAMES), kind
        assert shape[:3] == [("heading_open", "h1"), [("text", "TITLE")], ("heading_close", "h1")], kind
        assert card.data.model_name == names["MODEL"], kind


def test_an_export_of_a_folder_with_no_card_is_titled_by_its_name_on_one_line(tmp_path):
    from hf_vanilla_transformer.export import onnx

    for number, name in enumerate(HOSTILE_NAMES):
        (tmp_path / str(number)).mkdir()
        write_export_card(str(tmp_path), str(tmp_path / str(number)), f"runs/{name}", "onnx", [], onnx.usage(50))
        text = ModelCard.load(tmp_path / str(number) / "README.md").text
        assert markdown_shape(text, names_of(name))[:4] == [
            ("heading_open", "h1"),
            [("text", "TITLE")],
            ("heading_close", "h1"),
            ("heading_open", "h2"),
        ], name


@pytest.mark.parametrize("name", [HOSTILE_MODEL_ID.removeprefix("runs/"), *HOSTILE_NAMES])
def test_a_push_renames_a_model_path_of_any_characters_in_every_cards_code(write_cards, plain_cards, tmp_path, name):
    """card_for finds the path where the card writers put it (a code literal in code blocks and spans, a shell
    word) and names the repository there instead; the rest of the card reads as it did."""
    from hf_vanilla_transformer.sharing.hub import card_for

    names = names_of(name)
    for kind, card in write_cards(EXAMPLE, names["MODEL"], names["DATA"], names["SOURCE"]).items():
        card.save(tmp_path / "README.md")
        pushed = ModelCard(card_for(tmp_path / "README.md", "someone/tiny-en-de").decode())
        pushed_shape = markdown_shape(pushed.text, names | {"MODEL": "someone/tiny-en-de"})
        assert pushed_shape == markdown_shape(plain_cards[kind].text, PLAIN_NAMES), kind
        assert names["MODEL"] not in pushed.text, kind


# Any text (but NUL, which CommonMark shows as U+FFFD), and text of what Markdown is made of
MARKDOWN_TEXT = st.text(st.characters(exclude_characters="\x00")) | st.lists(
    st.sampled_from([*"`~*_[]<>&|#$!-+=.)(1 \n\\a", "```", "# ", "1. ", "- ", "<b>", "&amp;", "[a](b)"])
).map("".join)

# Where the cards put a name or a sentence: a paragraph (a line's start), a title, a list, a table's cell, a
# picture's description
PLACES = ["{}", "# {}", "- a {}", "| a | {} |\n| --- | --- |", "![{}](a.png)"]


@FUZZ_SETTINGS
@given(MARKDOWN_TEXT, st.sampled_from(PLACES))
def test_markdown_text_shows_the_text_as_written_on_one_line_wherever_it_goes(text, place):
    shown = " ".join(text.split())
    assume(shown)
    inline = [token for token in MARKDOWN.parse(place.format(markdown_text(text))) if token.type == "inline"][-1]
    children = inline.children
    if place.startswith("!"):
        (image,) = children
        assert image.type == "image" and image.attrs["src"] == "a.png"
        children = image.children
    assert {child.type for child in children} == {"text"}
    assert "".join(child.content for child in children) == ("a " if place.startswith("- ") else "") + shown


@FUZZ_SETTINGS
@given(MARKDOWN_TEXT.filter(lambda code: code and "\n" not in code and "\r" not in code))
def test_inline_code_is_one_code_span_of_the_code_as_written(code):
    (paragraph,) = [token for token in MARKDOWN.parse(f"see {inline_code(code)} here") if token.type == "inline"]
    assert [(child.type, child.content) for child in paragraph.children] == [
        ("text", "see "),
        ("code_inline", code),
        ("text", " here"),
    ]


@FUZZ_SETTINGS
@given(MARKDOWN_TEXT)
def test_a_fenced_block_holds_the_code_as_written_whatever_fences_it_holds(code):
    tokens = MARKDOWN.parse(f"before\n\n{fenced_block('bash', code)}\n\nafter\n")
    lines = code.replace("\r\n", "\n").replace("\r", "\n")  # CommonMark's line ends
    assert [(token.info, token.content) for token in tokens if token.type == "fence"] == [
        ("bash", lines if lines.endswith("\n") or not lines else lines + "\n")
    ]
    assert tokens[-2].content == "after"
