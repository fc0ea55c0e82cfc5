"""One length rule on every route (our model's generate(), CTranslate2, ONNX Runtime): Section 6.1's limit, the
source length + 50 tokens with `</s>` the last of them, which `max_new_tokens` caps (cutting where it comes first,
`</s>` or not) but never raises."""

import pytest

from hf_vanilla_transformer.engines.registry import load_translator
from hf_vanilla_transformer.export.ctranslate2 import export as export_ctranslate2
from hf_vanilla_transformer.export.onnx import export as export_onnx
from hf_vanilla_transformer.translation.lines import translate_lines
from support.models import letter_tokenizer, tiny_model

# 5 and 13 tokens, and </s>: Section 6.1 lets them have 56 and 64 tokens, the last `</s>`
SOURCES = ["a b c d e", "a b c d e f g h i j a b c"]


def save_untrained(folder) -> str:
    """A tiny random model with the letter tokenizer and a new model's decoding (greedy, the source length + 50).
    Untrained, it never ends a sentence by itself, so every translation runs to its limit; `<s>`, `<pad>` and `<unk>`
    are never written, so that a translation's words are its tokens. One head count (CTranslate2 needs it)."""
    model = tiny_model(vocab_size=14, decoder_attention_heads=4)
    model.generation_config.suppress_tokens = [0, 1, 3]
    model.save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    """The model folder and its CTranslate2 export; the ONNX export (torch.export: half a minute) only when a slow
    test asks for it."""
    root = tmp_path_factory.mktemp("length-rule")
    model = save_untrained(root / "model")
    folders = {"generate": model, "ctranslate2": export_ctranslate2(model, str(root / "ct2"), "float32")}

    def folder(route: str) -> str:
        if route == "onnx" and route not in folders:
            folders[route] = export_onnx(model, str(root / "onnx"))
        return folders[route]

    return folder


@pytest.mark.parametrize("route", ["generate", "ctranslate2", pytest.param("onnx", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    ("max_new_tokens", "words"),
    [(None, [55, 63]), (200, [55, 63]), (60, [55, 60]), (56, [55, 56]), (3, [3, 3])],
)
def test_max_new_tokens_caps_section_6_1s_limit_on_every_route(routes, route, max_new_tokens, words):
    """Section 6.1's limit ends each translation with `</s>` as its last token: 55 and 63 words. `max_new_tokens`
    cuts a translation that would run past it (60: the second) and leaves the others at Section 6.1's limit, on
    every route as through generate(); the translations are the same."""
    limit = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}

    def translations(route: str) -> list[str]:
        translator = load_translator(routes(route), "cpu", "float32" if route == "generate" else "auto")
        return translate_lines(translator, SOURCES, 2, limit, False)

    found = translations(route)
    assert [len(text.split()) for text in found] == words
    assert found == translations("generate")
