"""hf_vanilla_transformer.loading: a model folder from someone else loads checked, or fails in one line naming the
file, before memory is spent on it and without running the folder's code."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import event, given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, loading
from hf_vanilla_transformer.loading import (
    ModelFolderError,
    load_model,
    load_model_and_tokenizer,
    load_ours,
    load_tokenizer,
    memory_to_load,
    model_size,
    stored_weights,
)
from support.hostile import FUZZ_SETTINGS, JSON_VALUES, assert_one_line_error
from support.hub_server import COMMIT, served_hub
from support.models import letter_tokenizer, tiny_config, tiny_model
from support.processes import peak_growth

FOLDER_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    tiny_model().save_pretrained(folder)
    letter_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def transformers_log(caplog):
    """What transformers logs: its loggers pass nothing on to the root logger, where caplog listens."""
    logger = logging.getLogger("transformers")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def broken_copy(model_folder: Path, destination: Path) -> Path:
    shutil.copytree(model_folder, destination)
    return destination


def edit_config(folder: Path, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **values}))


def edit_weights(folder: Path, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_sound_folder_loads_the_same_model_and_tokenizer(model_folder):
    model, tokenizer = load_model_and_tokenizer(str(model_folder), "cpu")
    expected = tiny_model().state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())
    assert tokenizer("a b")["input_ids"] == [4, 5, 2]


def set_nan(weights):
    weights["model.shared.weight"][0, 0] = float("nan")


def set_inf(weights):
    weights["model.decoder.layers.0.feed_forward.fc1.weight"][1, 2] = float("inf")


def drop_bias(weights):
    del weights["model.encoder.layers.1.feed_forward.fc2.bias"]


def rename_bias(weights):
    weights["model.encoder.layers.1.feed_forward.fc2.b"] = weights.pop("model.encoder.layers.1.feed_forward.fc2.bias")


def rename_all(weights):
    for name in list(weights):
        weights[name.replace("model.", "transformer.")] = weights.pop(name)


def reshape_fc1(weights):
    weights["model.decoder.layers.0.feed_forward.fc1.weight"] = torch.zeros(41, 32)


def shrink_fc1(weights):
    weights["model.decoder.layers.0.feed_forward.fc1.weight"] = torch.zeros(3, 3)


def add_tensor(weights):
    weights["model.encoder.layers.1.feed_forward.fc3.weight"] = torch.zeros(3, 3)


def drop_config_keys(folder: Path, *names: str, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**{k: v for k, v in config.items() if k not in names}, **values}))


@pytest.mark.parametrize(
    "break_folder, file, message",
    [
        (
            lambda f: edit_config(f, d_model=10**12),
            "config.json",
            "describes a model of 32,000,000,000,562,000,000,000,216 "
            "weights, but {folder}/model.safetensors holds 50,968; they do not belong together",
        ),
        (lambda f: edit_config(f, encoder_layers=10**9), "config.json", "describes a model of 7,376,000,036,216"),
        # hundreds of layers of feed-forward width 1: fewer weights in the layers the file holds, many more in the
        # attention sub-layers it lacks
        (
            lambda f: edit_config(f, encoder_layers=300, decoder_layers=300, encoder_ffn_dim=1, decoder_ffn_dim=1),
            "config.json",
            "describes a model of 3,843,768 weights, but {folder}/model.safetensors holds 50,968",
        ),
        # sizes beyond any float: the error says them in full
        (lambda f: edit_config(f, max_position_embeddings=10**400), "config.json", "00000) needs about "),
        (lambda f: edit_config(f, d_model=10**400), "config.json", "integer division result too large for a float"),
        (
            lambda f: edit_config(f, max_position_embeddings=2**60),
            "config.json",
            "(50,968 weights in 71 tensors, d_model=32, max_position_embeddings=1152921504606846976) needs about ",
        ),
        (
            lambda f: edit_config(f, layer_norm_eps=float("inf")),
            "config.json",
            "VanillaTransformerConfig.layer_norm_eps=inf is invalid: it must be positive and finite",
        ),
        (lambda f: edit_config(f, dropout=float("nan")), "config.json", "dropout=nan is invalid: it must be in [0, 1)"),
        (
            lambda f: edit_config(f, d_model="32"),
            "config.json",
            "Validation error for field 'd_model': TypeError: Field 'd_model' expected int, got str (value: '32')",
        ),
        (
            lambda f: drop_config_keys(f, "auto_map", model_type="bert"),
            "",
            "Unrecognized configuration class "
            "<class 'transformers.models.bert.configuration_bert.BertConfig'> for this kind of AutoModel: "
            "AutoModelForSeq2SeqLM.",
        ),
        (
            lambda f: drop_config_keys(f, "auto_map", model_type="not_registered"),
            "config.json",
            "has model type `not_registered` but Transformers does not recognize this architecture",
        ),
        (
            lambda f: drop_config_keys(f, "auto_map", model_type=None),
            "config.json",
            "has model type `None` but Transformers does not",
        ),
        (
            lambda f: drop_config_keys(f, "auto_map", "model_type"),
            "config.json",
            "Should have a `model_type` key in its config.json",
        ),
        # our folders name our code (auto_map): with an unknown model type transformers refuses to run it
        (lambda f: edit_config(f, model_type="bert"), "", "contains custom code which must be executed"),
        (
            lambda f: edit_config(f, required_versions={"transformers": "99.1.0"}),
            "config.json",
            "this model (required_versions in its config) needs transformers >= 99.1.0; this Python has transformers "
            f"{transformers.__version__}",
        ),
        (lambda f: edit_config(f, required_versions={"torch": "two"}), "config.json", "'two' is not a version number"),
        (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json", "holds a JSON list, not an object"),
        (lambda f: (f / "config.json").write_bytes(b"\x00\xff"), "config.json", "not a valid JSON file"),
        (lambda f: edit_weights(f, set_nan), "model.safetensors", "model.shared.weight holds NaN or infinite values"),
        (
            lambda f: edit_weights(f, set_inf),
            "model.safetensors",
            "model.decoder.layers.0.feed_forward.fc1.weight holds NaN or infinite values",
        ),
        (
            lambda f: edit_weights(f, drop_bias),
            "config.json",
            "describes a model of 50,968 weights, but {folder}/model.safetensors holds 50,936",
        ),
        (
            lambda f: edit_weights(f, rename_bias),
            "model.safetensors",
            "1 weights missing: model.encoder.layers.1.feed_forward.fc2.bias",
        ),
        (
            lambda f: edit_weights(f, rename_all),
            "model.safetensors",
            "74 weights missing: lm_head.weight, model.decoder.embeddings.embed_tokens.weight, "
            "model.decoder.layers.0.encoder_attn.kv_proj.weight and 71 more",
        ),
        (
            lambda f: edit_weights(f, add_tensor),
            "model.safetensors",
            "1 weights unexpected: model.encoder.layers.1.feed_forward.fc3.weight",
        ),
        (
            lambda f: edit_weights(f, reshape_fc1),
            "model.safetensors",
            "1 weights of another shape than the config gives: model.decoder.layers.0.feed_forward.fc1.weight "
            "(41, 32), not (40, 32)",
        ),
        (lambda f: edit_weights(f, shrink_fc1), "config.json", "describes a model of 50,968 weights, but"),
        (
            lambda f: (f / "model.safetensors").write_bytes(b"\x10"),
            "model.safetensors",
            "not a readable safetensors file (Error while deserializing header: header too small)",
        ),
        (lambda f: (f / "model.safetensors").unlink(), "", "no file named model.safetensors"),
        (lambda f: (f / "tokenizer.json").write_text('{"version": '), "tokenizer.json", "not a valid JSON file"),
        (
            lambda f: (f / "tokenizer.json").unlink(),
            "",
            "no usable tokenizer (no tokenizer.json, and transformers could build none from the other files)",
        ),
    ],
)
def test_each_broken_folder_is_one_line_naming_the_file(
    model_folder, tmp_path, transformers_log, break_folder, file, message
):
    folder = broken_copy(model_folder, tmp_path / "broken")
    break_folder(folder)
    with pytest.raises(ModelFolderError) as error:
        load_model_and_tokenizer(str(folder), "cpu")
    assert_one_line_error(error.value, str(folder))
    assert "LOAD REPORT" not in transformers_log.text  # the error says it in one line, not a table a weight a line
    if file is not None:  # "": the folder itself
        assert str(error.value).startswith(f"{folder}/{file}: " if file else f"{folder}: ")
    assert message.format(folder=folder) in str(error.value)


def test_a_folder_is_never_asked_to_run_its_own_code(model_folder, tmp_path):
    """A config naming code of its own (auto_map) for an unknown model type is refused, not run or prompted for."""
    folder = broken_copy(model_folder, tmp_path / "remote")
    edit_config(folder, model_type="not_registered", auto_map={"AutoConfig": "evil.Config"})
    (folder / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    with pytest.raises(ModelFolderError, match="contains custom code which must be executed"):
        load_model(str(folder), "cpu")
    assert not (tmp_path / "ran").exists()


def test_the_errors_name_the_path_of_a_missing_folder(tmp_path):
    missing = re.escape(str(tmp_path / "none"))
    with pytest.raises(ModelFolderError, match=rf"^{missing}: not a model folder \(no config.json\)$"):
        load_model(str(tmp_path / "none"), "cpu")
    with pytest.raises(ModelFolderError, match=rf"^{missing}: no such folder$"):
        load_tokenizer(str(tmp_path / "none"))


@pytest.mark.parametrize("mistyped", ["runs/multi30k-smal", "runs"])
def test_a_mistyped_local_path_is_a_missing_folder_not_a_hub_download(model_folder, tmp_path, monkeypatch, mistyped):
    """`runs/multi30k-smal` (a letter missing) where `runs/` is here reads as a Hub id; it must not be looked up
    there, where any Hub user `runs` could have put a repository of that name."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(model_folder, tmp_path / "runs" / "multi30k-small")
    if mistyped == "runs":  # an existing folder that is not a model
        (tmp_path / "runs" / "notes.txt").write_text("")
    with pytest.raises(ModelFolderError, match=rf"^{mistyped}: not a model folder \(no config.json\)$"):
        load_model_and_tokenizer(mistyped, "cpu")


# A model repository on the Hub with more than a model in it: code that would run if loaded, the training's pickle,
# a checkpoint with its optimizer state.
NOT_MODEL_FILES = ["modeling_evil.py", "training_args.bin", "checkpoint-8/optimizer.pt", ".env"]


@pytest.mark.slow  # a process of its own for the endpoint: torch and transformers load in it
def test_a_hub_model_is_said_to_come_from_the_hub_and_only_its_model_files_are_downloaded(model_folder, tmp_path):
    files = {path.name: path.read_bytes() for path in model_folder.iterdir()}
    files.update(dict.fromkeys(NOT_MODEL_FILES, b"not for loading"))
    code = (
        "from hf_vanilla_transformer.loading import load_model_and_tokenizer\n"
        "model, tokenizer = load_model_and_tokenizer('someone/tiny', 'cpu')\n"
        "print(type(model).__name__, tokenizer('a b')['input_ids'])\n"
    )
    with served_hub("someone/tiny", files) as (endpoint, requested):
        env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "home")}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "VanillaTransformerForConditionalGeneration [4, 5, 2]\n"
    assert "someone/tiny: no such folder here; loading the model of that id from the Hugging Face Hub" in result.stderr
    downloaded = {path.rpartition(f"/{COMMIT}/")[2] for path in requested if "/resolve/" in path}
    assert downloaded == set(FOLDER_FILES)


# integers of sizes that fit in memory, and far beyond it; those between build a real, large model, which is no error
CONFIG_VALUES = st.one_of(JSON_VALUES, st.integers(-3, 3000), st.integers(2**40, 2**70), st.sampled_from([1e300, -0.0]))


@FUZZ_SETTINGS
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(json.loads(tiny_model().config.to_json_string()))), CONFIG_VALUES, min_size=1, max_size=3
    )
)
def test_any_config_json_loads_a_usable_model_or_is_one_line_naming_the_folder(model_folder, changes):
    with tempfile.TemporaryDirectory() as scratch:
        folder = broken_copy(model_folder, Path(scratch) / "fuzz")
        edit_config(folder, **changes)
        try:
            model = load_model(str(folder), "cpu")
        except ModelFolderError as error:
            assert_one_line_error(error, str(folder))
            event("refused")
            return
    event("loaded")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[4, 5, 2]]), decoder_input_ids=torch.tensor([[0, 4]])).logits
    assert torch.isfinite(logits).all()


@FUZZ_SETTINGS
@given(
    file=st.sampled_from(FOLDER_FILES),
    damage=st.one_of(
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("flip"), st.floats(0, 1)),
        st.tuples(st.just("replace"), st.binary(max_size=64)),
        st.tuples(st.just("delete"), st.none()),
    ),
)
def test_any_damaged_file_loads_or_is_one_line_naming_the_folder(model_folder, file, damage):
    with tempfile.TemporaryDirectory() as scratch:
        folder = broken_copy(model_folder, Path(scratch) / "fuzz")
        path = folder / file
        content = path.read_bytes()
        kind, value = damage
        if kind == "truncate":
            path.write_bytes(content[: int(len(content) * value)])
        elif kind == "flip":
            position = min(int(len(content) * value), len(content) - 1)
            path.write_bytes(content[:position] + bytes([content[position] ^ 0xFF]) + content[position + 1 :])
        elif kind == "replace":
            path.write_bytes(value)
        else:
            path.unlink()
        try:
            model, tokenizer = load_model_and_tokenizer(str(folder), "cpu")
        except ModelFolderError as error:
            assert_one_line_error(error, str(folder))
            event("refused")
            return
    event("loaded")
    assert all(torch.isfinite(tensor).all() for tensor in model.state_dict().values() if tensor.is_floating_point())
    assert tokenizer.decode(tokenizer("a b")["input_ids"], skip_special_tokens=True).replace(" ", "") in ("ab", "")


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": False},
        {"position_embedding_type": "learned"},
        {"layer_norm_position": "pre"},
        {"head_dim": 5, "v_head_dim": 3, "encoder_layers": 1, "decoder_layers": 4},
        {"d_model": 30, "encoder_attention_heads": 3, "decoder_attention_heads": 5, "encoder_ffn_dim": 1},
    ],
)
def test_the_model_size_a_config_gives_is_the_built_models(overrides):
    config = tiny_config(**overrides)
    built = VanillaTransformerForConditionalGeneration(config)
    assert model_size(config) == (built.num_parameters(), len(list(built.parameters())))


def saved_model(folder: Path, dtype=torch.float32, **overrides) -> Path:
    torch.manual_seed(0)
    VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).to(dtype).save_pretrained(folder)
    return folder


# what loading a folder of each kind takes: the weights of a small model; the positional tables of a long one; the
# records transformers keeps of each tensor of many tiny layers; one wide feed-forward network; a model saved in one
# dtype and loaded in another, the file and the model in memory at once
LOADS = {
    "small": ({"vocab_size": 8000, "d_model": 256, "encoder_attention_heads": 4, "decoder_attention_heads": 4}, None),
    "many positions": ({"max_position_embeddings": 1_000_000}, None),
    "many tiny layers": (
        {
            "d_model": 8,
            "encoder_attention_heads": 1,
            "decoder_attention_heads": 1,
            "encoder_layers": 300,
            "decoder_layers": 300,
            "encoder_ffn_dim": 1,
            "decoder_ffn_dim": 1,
        },
        None,
    ),
    "wide feed-forward": ({"encoder_ffn_dim": 100_000, "decoder_ffn_dim": 100_000}, None),
    "bfloat16 as float32": ({"vocab_size": 8000, "d_model": 256, "encoder_ffn_dim": 4096}, "float32"),
}


@pytest.mark.slow  # a process of its own for each load, and models of up to 130 MB
@pytest.mark.parametrize("kind", LOADS)
def test_the_memory_a_load_is_said_to_need_covers_what_it_takes(model_folder, tmp_path, kind):
    overrides, dtype = LOADS[kind]
    saved_dtype = torch.bfloat16 if dtype == "float32" else torch.float32
    folder = saved_model(tmp_path / "model", saved_dtype, **overrides)
    config = VanillaTransformerConfig.from_pretrained(folder)
    estimate = memory_to_load(config, dtype, stored_weights(str(folder / "model.safetensors")))
    taken = peak_growth(
        f"from hf_vanilla_transformer.loading import load_model\nload_model({str(model_folder)!r}, 'cpu')",
        f"load_model({str(folder)!r}, 'cpu', dtype={dtype!r})",
    )
    assert taken <= estimate <= 3 * taken, (taken / 2**20, estimate / 2**20)


def test_a_model_that_does_not_fit_in_the_memory_left_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """Four million positions of width 32: two positional tables of half a GiB, and a third while one is
    recomputed (the test above measures what such tables take), where 1 GiB is free."""
    folder = saved_model(tmp_path / "model")
    edit_config(folder, max_position_embeddings=4_000_000)
    monkeypatch.setattr(loading, "available_memory", lambda: 2**30)
    with pytest.raises(ModelFolderError, match=r"needs about 1\.\d GiB to load, more than the 1\.0 GiB free"):
        load_model(str(folder), "cpu")


def test_another_model_type_is_refused_for_an_export_before_it_is_loaded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "marian"}))  # no weights, no tokenizer
    with pytest.raises(ModelFolderError, match=r"/config.json: model_type 'marian' is not ours \(vanilla_"):
        load_ours(str(tmp_path))


def test_a_folders_positions_are_its_generation_configs_max_length_else_its_configs(tmp_path):
    """`max_positions`, the one reader of a folder's positions: the generation config's `max_length`; where it
    sets none (a hand-edited folder, or an export whose config is Marian's), config.json's
    `max_position_embeddings`; where neither says, one error naming the generation config."""
    from transformers import GenerationConfig

    assert loading.max_positions(GenerationConfig(max_length=48), str(tmp_path)) == 48
    without = GenerationConfig()
    without.max_length = None
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 96}))
    assert loading.max_positions(without, str(tmp_path)) == 96
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "ctranslate2's own"}))
    with pytest.raises(ModelFolderError, match=r"generation_config.json: no max_length, and no config.json with"):
        loading.max_positions(without, str(tmp_path))
    with pytest.raises(ModelFolderError, match=r"^generation_config.json: no max_length"):
        loading.max_positions(without)
