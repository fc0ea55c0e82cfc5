"""VanillaTransformerConfig: the paper's defaults, presets, HF attribute names and clear errors for bad values."""

import inspect
import json
from importlib.metadata import version
from typing import Literal

import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import AutoConfig

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.configuration_vanilla_transformer import REQUIRED_VERSIONS, release


def test_defaults_are_the_papers_base_model():
    config = VanillaTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.dropout) == (8, 2048, 0.1)
    assert config.activation_function == "relu"
    assert config.position_embedding_type == "sinusoidal"
    assert config.layer_norm_position == "post"
    assert config.scale_embedding and config.tie_word_embeddings and config.is_encoder_decoder
    assert config.attention_dropout == config.activation_dropout == 0.0
    assert config.init_std == pytest.approx(512**-0.5)
    assert config.attention_head_dims(8) == (64, 64)


def test_attribute_map_gives_the_standard_names():
    config = VanillaTransformerConfig(d_model=256, encoder_attention_heads=4, encoder_layers=3)
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (256, 4, 3)


@pytest.mark.parametrize(
    "preset, expected",
    [
        ("base", dict(d_model=512, encoder_ffn_dim=2048, encoder_attention_heads=8, dropout=0.1, encoder_layers=6)),
        ("big", dict(d_model=1024, encoder_ffn_dim=4096, encoder_attention_heads=16, dropout=0.3, encoder_layers=6)),
        ("small", dict(d_model=256, encoder_ffn_dim=1024, encoder_attention_heads=4, dropout=0.1, encoder_layers=3)),
    ],
)
def test_presets(preset, expected):
    config = VanillaTransformerConfig.from_preset(preset)
    assert {key: getattr(config, key) for key in expected} == expected
    assert config.decoder_layers == config.encoder_layers
    assert config.decoder_ffn_dim == config.encoder_ffn_dim


def test_preset_overrides_and_unknown_preset():
    config = VanillaTransformerConfig.from_preset("base", vocab_size=1234, dropout=0.2)
    assert (config.vocab_size, config.dropout, config.d_model) == (1234, 0.2, 512)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        VanillaTransformerConfig.from_preset("huge")


def test_small_preset_size():
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("small"))
    assert model.config.vocab_size == 8000 and round(model.num_parameters() / 1e6, 1) == 7.6


@pytest.mark.parametrize("preset, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_count_matches_table_3(preset, paper_millions):
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig.from_preset(preset, vocab_size=37000)
        )
    millions = model.num_parameters() / 1e6
    print(f"{preset}: {millions:.1f}M parameters (paper, Table 3: {paper_millions}M)")
    assert abs(millions - paper_millions) / paper_millions < 0.05


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=500), r"encoder_attention_heads=8 is invalid: it must divide d_model=500"),
        (dict(decoder_attention_heads=3), r"decoder_attention_heads=3 is invalid: it must divide d_model=512"),
        (dict(d_model=0), r"d_model=0 is invalid: it must be a positive integer"),
        (dict(encoder_layers=-1), r"encoder_layers=-1 is invalid"),
        (dict(decoder_ffn_dim=0), r"decoder_ffn_dim=0 is invalid"),
        (dict(vocab_size=0), r"vocab_size=0 is invalid"),
        (dict(head_dim=0), r"head_dim=0 is invalid"),
        (dict(dropout=1.0), r"dropout=1.0 is invalid: it must be in \[0, 1\)"),
        (dict(attention_dropout=-0.1), r"attention_dropout=-0.1 is invalid"),
        (dict(activation_function="swishy"), r"activation_function='swishy' is invalid"),
        (dict(pad_token_id=37000), r"pad_token_id=37000 is invalid: it must be a token id in the vocabulary"),
        (dict(vocab_size=100, eos_token_id=100), r"eos_token_id=100 is invalid"),
        (dict(decoder_start_token_id=-1), r"decoder_start_token_id=-1 is invalid"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        VanillaTransformerConfig(**overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(position_embedding_type="rotary"),
            r"field 'position_embedding_type':\n.*expected one of \('sinusoidal', 'learned'\), got rotary",
        ),
        (dict(layer_norm_position="middle"), r"field 'layer_norm_position':\n.*expected one of \('post', 'pre'\)"),
        (dict(d_model="abc"), r"field 'd_model':\n.*expected int, got str \(value: 'abc'\)"),
    ],
)
def test_values_of_the_wrong_type_are_refused_by_strict_naming_the_field(overrides, message):
    with pytest.raises(StrictDataclassFieldValidationError, match=message):
        VanillaTransformerConfig(**overrides)


def test_enum_like_fields_show_their_values_in_the_signature():
    parameters = inspect.signature(VanillaTransformerConfig).parameters
    assert parameters["position_embedding_type"].annotation == Literal["sinusoidal", "learned"]
    assert parameters["layer_norm_position"].annotation == Literal["post", "pre"]
    config = VanillaTransformerConfig()
    with pytest.raises(StrictDataclassFieldValidationError, match=r"expected one of \('post', 'pre'\), got side"):
        config.layer_norm_position = "side"


def test_head_dim_lifts_the_divisibility_rule():
    config = VanillaTransformerConfig(d_model=500, head_dim=64, v_head_dim=32)
    assert config.attention_head_dims(8) == (64, 32)


def test_round_trip_through_auto_config(tmp_path):
    config = VanillaTransformerConfig.from_preset("small", position_embedding_type="learned", head_dim=16)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is VanillaTransformerConfig
    assert loaded.to_diff_dict() == config.to_diff_dict()
    assert (loaded.position_embedding_type, loaded.head_dim, loaded.d_model) == ("learned", 16, 256)


def test_a_saved_config_records_the_oldest_releases_its_code_needs(tmp_path):
    VanillaTransformerConfig().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["required_versions"] == REQUIRED_VERSIONS == {"transformers": "5.16.0", "torch": "2.6.0"}
    assert release(transformers.__version__) >= release(REQUIRED_VERSIONS["transformers"])
    assert release("2.13.0+cpu") == (2, 13, 0) and release("2.7.0a0") == (2, 7, 0)


def test_a_config_whose_recorded_releases_are_not_installed_is_refused_naming_both_versions():
    with pytest.raises(ValueError) as error:
        VanillaTransformerConfig(required_versions={"torch": "99.0"})
    assert str(error.value) == (
        f"this model (required_versions in its config) needs torch >= 99.0; this Python has torch {version('torch')} "
        "(pip install -U 'torch>=99.0')"
    )
    # met: the record becomes this code's own
    assert VanillaTransformerConfig(required_versions={"torch": "1.0"}).required_versions == REQUIRED_VERSIONS


def test_a_filled_in_head_dim_and_init_std_follow_d_model_and_the_head_counts(tmp_path):
    VanillaTransformerConfig.from_preset("small").save_pretrained(tmp_path)  # saves head_dim 64, init_std 1/16
    loaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert (loaded.head_dim, loaded.init_std) == (64, 256**-0.5)
    loaded.d_model = 512
    assert (loaded.head_dim, loaded.init_std) == (128, 512**-0.5)
    model = VanillaTransformerForConditionalGeneration(loaded)
    assert model.model.encoder.layers[0].self_attn.q_proj.weight.shape == (512, 512)  # d_k = d_model / h, h = 4
    loaded.hidden_size = 256  # the standard name, through attribute_map
    loaded.num_attention_heads = 8  # the encoder's heads only: the stacks now disagree, so there is no one d_k
    assert (loaded.head_dim, loaded.attention_head_dims(8), loaded.attention_head_dims(4)) == (None, (32, 32), (64, 64))
    loaded.decoder_attention_heads = 8
    assert loaded.head_dim == 32
    by_keyword = VanillaTransformerConfig.from_pretrained(tmp_path, d_model=128)
    assert (by_keyword.head_dim, by_keyword.init_std) == (32, 128**-0.5)


def test_a_chosen_head_dim_and_init_std_stay_when_d_model_changes():
    config = VanillaTransformerConfig.from_preset("small", head_dim=16, init_std=0.02)
    config.d_model = 512
    assert (config.head_dim, config.init_std) == (16, 0.02)
    config.d_model = 250  # d_model / h need not be whole where head_dim is chosen
    assert config.attention_head_dims(4) == (16, 16)
    derived = VanillaTransformerConfig.from_preset("small")
    derived.d_model = 250  # 250 / 4 heads: no whole d_k, refused where the model is built
    assert derived.head_dim is None
    with pytest.raises(ValueError, match="encoder_attention_heads=4 is invalid: it must divide d_model=250"):
        derived.validate_hyperparameters()
