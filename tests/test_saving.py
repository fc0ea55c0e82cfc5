"""save_pretrained / from_pretrained: exact round trips in safetensors, auto classes, and remote code."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import EOS, PAD, tiny_model
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)

SOURCES = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
TARGETS = torch.tensor([[0, 20, 21, 22], [0, 23, 24, 25]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=SOURCES, attention_mask=(SOURCES != PAD).long(), decoder_input_ids=TARGETS).logits


def saved_tensor_names(folder) -> set[str]:
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as weights:
        return set(weights.keys())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": False}, {"position_embedding_type": "learned", "layer_norm_position": "pre"}],
)
def test_round_trip_is_exact_and_silent(tmp_path, capfd, overrides):
    model = tiny_model(**overrides)
    model.generation_config.num_beams = 5
    model.save_pretrained(tmp_path)
    capfd.readouterr()

    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    assert {key: list(value) for key, value in info.items() if value} == {}
    assert "missing" not in capfd.readouterr().err.lower()
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    assert all(torch.equal(original[name], reloaded[name]) for name in original)
    torch.testing.assert_close(logits(loaded.eval()), logits(model), atol=0, rtol=0)
    assert loaded.generation_config.num_beams == 5
    assert (loaded.model.shared is None) == (overrides.get("tie_word_embeddings") is False)


def test_tied_embedding_is_stored_once_and_sinusoids_not_at_all(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    names = saved_tensor_names(tmp_path)
    embedding_names = {name for name in names if "embed" in name or "shared" in name or "lm_head" in name}
    assert embedding_names == {"model.shared.weight"}
    assert not any("embed_positions" in name for name in names)

    tiny_model(tie_word_embeddings=False).save_pretrained(tmp_path / "untied")
    untied = {name for name in saved_tensor_names(tmp_path / "untied") if "embed" in name or "lm_head" in name}
    assert untied == {
        "lm_head.weight",
        "model.encoder.embeddings.embed_tokens.weight",
        "model.decoder.embeddings.embed_tokens.weight",
    }


def test_loaded_model_keeps_the_three_way_tie(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared and loaded.model.decoder.embeddings.embed_tokens.weight is shared


def test_auto_model_loads_the_base_model(tmp_path):
    torch.manual_seed(0)
    VanillaTransformerModel(tiny_model().config).save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)) is VanillaTransformerModel
    assert type(AutoConfig.from_pretrained(tmp_path)) is VanillaTransformerConfig


def test_auto_classes_build_the_model_from_its_config():
    config = tiny_model().config
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is VanillaTransformerForConditionalGeneration
    assert type(AutoModel.from_config(config)) is VanillaTransformerModel


def test_saved_folder_carries_its_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert (tmp_path / "configuration_vanilla_transformer.py").exists()
    assert (tmp_path / "modeling_vanilla_transformer.py").exists()


def test_loads_with_remote_code_where_the_package_is_not_importable(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    expected = logits(model)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["hf_vanilla_transformer"] = None  # any import of the package now fails
        import torch
        from transformers import AutoModelForSeq2SeqLM
        folder = {str(tmp_path / "model")!r}
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager")
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        sources = torch.tensor({SOURCES.tolist()})
        with torch.no_grad():
            logits = model(input_ids=sources, attention_mask=(sources != {PAD}).long(),
                           decoder_input_ids=torch.tensor({TARGETS.tolist()})).logits
        torch.save(logits, {str(tmp_path / "logits.pt")!r})
        print(model.generate(sources, attention_mask=(sources != {PAD}).long(), max_new_tokens=4).tolist())
        """
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, atol=0, rtol=0)
    generated = model.generate(SOURCES, attention_mask=(SOURCES != PAD).long(), max_new_tokens=4).tolist()
    assert result.stdout.strip() == str(generated)
