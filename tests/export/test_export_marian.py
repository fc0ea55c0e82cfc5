"""hf_vanilla_transformer.export.marian: our model as transformers' own MarianMTModel computes what ours does,
and its folder loads with plain transformers."""

import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianMTModel

from hf_vanilla_transformer.export.marian import export, marian_feature_order, marian_model
from hf_vanilla_transformer.model.modeling_vanilla_transformer import (
    VanillaTransformerSinusoidalPositionalEncoding,
    paper_generation_config,
)
from support.models import letter_tokenizer, tiny_model
from support.processes import run_python

# decoding without the per-sentence limit, which Marian does not have, so that an untrained model's endless
# translations stop at the same place in both
DECODING = {"max_new_tokens": 12, "max_new_tokens_over_source": None}


def test_the_permutation_turns_our_sinusoids_into_marians():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    ours = VanillaTransformerSinusoidalPositionalEncoding.compute_encoding(50, 32)
    marian = MarianSinusoidalPositionalEmbedding(50, 32).create_weight()
    torch.testing.assert_close(ours[:, marian_feature_order(32)], marian, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": False}, {"activation_function": "gelu", "scale_embedding": False}],
    ids=["tied", "untied", "gelu-unscaled"],
)
def test_the_marian_model_computes_our_logits(padded_batch, overrides):
    """Random weights (every one matters), 4 encoder heads and 2 decoder heads, padding in the batch."""
    model = tiny_model(**overrides)
    with torch.no_grad():
        model.model.encoder.layers[0].feed_forward.fc2.bias.normal_()  # biases are zero after initialisation
        model.model.decoder.layers[1].self_attn_layer_norm.bias.normal_()
        ours = model(**padded_batch).logits
        theirs = marian_model(model)(**padded_batch).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def exported_pair(tmp_path_factory):
    """A tiny model folder of ours and its Marian export."""
    folder = tmp_path_factory.mktemp("export")
    model = tiny_model(vocab_size=14, max_position_embeddings=24)  # an untrained model's translations end soon
    model.generation_config = paper_generation_config(model.config)  # a trained model's decoding
    model.save_pretrained(folder / "ours")
    letter_tokenizer().save_pretrained(folder / "ours")
    export(str(folder / "ours"), str(folder / "marian"))
    return folder / "ours", folder / "marian"


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_export_decodes_as_ours_greedy_and_beam(exported_pair, num_beams):
    ours, marian = (AutoModelForSeq2SeqLM.from_pretrained(folder) for folder in exported_pair)
    assert isinstance(marian, MarianMTModel)
    batch = letter_tokenizer()(["a b c d e f", "j i h", "b"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = ours.generate(**batch, num_beams=num_beams, **DECODING)
        generated = marian.generate(**batch, num_beams=num_beams, max_new_tokens=12)
    assert generated.tolist() == expected.tolist()


def test_the_folder_carries_config_decoding_tokenizer_and_card(exported_pair):
    _, marian_folder = exported_pair
    config = json.loads((marian_folder / "config.json").read_text())
    assert config["model_type"] == "marian" and config["architectures"] == ["MarianMTModel"]
    assert "auto_map" not in config and "custom_pipelines" not in config
    assert not list(marian_folder.glob("*.py"))  # no code travels
    expected = {
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "decoder_start_token_id": 0,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "activation_function": "relu",
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 2,
        "forced_eos_token_id": None,
    }
    assert {key: config[key] for key in expected} == expected
    generation = json.loads((marian_folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["max_length"]) == (4, 0.6, 24)
    assert "max_new_tokens_over_source" not in generation  # Marian's generate() would ignore it
    card = (marian_folder / "README.md").read_text()
    assert "library_name: transformers" in card and "- marian" in card
    assert "source length + 50 tokens" in card and "`max_length`" in card  # what does not carry over, said


@pytest.mark.slow  # a fresh Python: 8 s of imports, too many for the quick tier
def test_the_cards_code_runs_with_plain_transformers_no_prompt_no_warning(exported_pair, tmp_path):
    """The card's code, then MarianMTModel, in a Python where `import hf_vanilla_transformer` fails, with standard
    input closed (a prompt would fail): the translation is ours, and nothing but progress bars is printed."""
    from huggingface_hub import ModelCard

    ours_folder, marian_folder = exported_pair
    card = ModelCard.load(marian_folder / "README.md").text
    code = card.split("```python\n", 1)[1].split("```", 1)[0]
    code += f"print(type(MarianMTModel.from_pretrained({str(marian_folder)!r})).__name__)\n"
    result = run_python("from transformers import MarianMTModel\n" + code, tmp_path / "home")
    ours = AutoModelForSeq2SeqLM.from_pretrained(ours_folder)
    tokenizer = letter_tokenizer()
    example = code.split('tokenizer(["', 1)[1].split('"]', 1)[0]
    expected = ours.generate(**tokenizer([example], return_tensors="pt"), max_new_tokens_over_source=None)
    assert result.stdout.splitlines() == [
        str(tokenizer.batch_decode(expected, skip_special_tokens=True)),
        "MarianMTModel",
    ]
    messages = [line for line in result.stderr.splitlines() if line.strip() and "Loading weights" not in line]
    assert not messages, result.stderr


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"layer_norm_position": "pre"}, r"layer_norm_position='pre', but Marian's layers are post-LN"),
        ({"position_embedding_type": "learned"}, r"position_embedding_type='learned', but Marian's positions are"),
        ({"head_dim": 16}, r"encoder_attention_heads=4, but with head_dim=16, v_head_dim=None: Marian's heads are"),
        ({"layer_norm_eps": 1e-6}, r"layer_norm_eps=1e-06, but Marian's LayerNorms use 1e-05"),
    ],
)
def test_what_marian_cannot_run_is_refused_in_one_line_and_nothing_is_written(tmp_path, overrides, message):
    tiny_model(vocab_size=14, **overrides).save_pretrained(tmp_path / "variant")
    letter_tokenizer().save_pretrained(tmp_path / "variant")
    with pytest.raises(ValueError, match=rf"variant/config.json: {message}.*; cannot export to Marian$"):
        export(str(tmp_path / "variant"), str(tmp_path / "out"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["variant"]


def test_the_command_and_python_m_export_and_report_bad_input_in_one_line(exported_pair, tmp_path, capsys):
    import runpy
    import sys

    from hf_vanilla_transformer.cli.export_marian import main as export_marian_main

    ours_folder, _ = exported_pair
    export_marian_main(["--model", str(ours_folder), "--output_dir", str(tmp_path / "marian")])
    assert capsys.readouterr().out == f"Wrote a MarianMTModel to {tmp_path / 'marian'}\n"
    assert json.loads((tmp_path / "marian" / "config.json").read_text())["model_type"] == "marian"
    with pytest.raises(SystemExit) as exit_info:
        export_marian_main(["--model", str(tmp_path / "nothing"), "--output_dir", str(tmp_path / "out")])
    assert (
        str(exit_info.value.code)
        == f"vanilla-export-marian: error: {tmp_path / 'nothing'}: not a model folder (no config.json)"
    )
    sys_argv = ["export_marian", "--model", str(ours_folder), "--output_dir", str(tmp_path / "marian")]
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.setattr(sys, "argv", sys_argv)
        patch.delitem(sys.modules, "hf_vanilla_transformer.cli.export_marian", raising=False)  # as in a new Python
        runpy.run_module("hf_vanilla_transformer.cli.export_marian", run_name="__main__")  # python -m
    assert str(exit_info.value.code) == (
        f"vanilla-export-marian: error: output_dir {tmp_path / 'marian'} exists and is not empty; add "
        "overwrite_output_dir to replace it"
    )


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_trained_models_export_translates_as_it_does(trained_run, model_and_tokenizer, tmp_path, num_beams):
    """200 Multi30k test sentences in batches of 20, greedy and beam 4, both at most 60 new tokens (the barely
    trained fixture repeats itself in some, and Marian lacks our per-sentence limit): every translation the same."""
    from hf_vanilla_transformer.training.data import read_translation_file
    from support.models import generate_text
    from support.paths import TEST

    model, tokenizer = model_and_tokenizer
    marian = MarianMTModel.from_pretrained(export(str(trained_run.output), str(tmp_path / "marian")))
    sources = [source for source, _ in read_translation_file(TEST, "en", "de")][:200]
    for start in range(0, len(sources), 20):
        batch = sources[start : start + 20]
        expected = generate_text(
            model, tokenizer, batch, num_beams=num_beams, max_new_tokens=60, max_new_tokens_over_source=None
        )
        assert generate_text(marian, tokenizer, batch, num_beams=num_beams, max_new_tokens=60) == expected
