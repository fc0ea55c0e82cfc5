"""hf_vanilla_transformer.export.onnx and engines.onnx: the ONNX graphs compute our logits step by step from
their own past, ONNX Runtime's greedy loop decodes as `generate(num_beams=1)` does (the per-sentence limit included),
and the folder has the layout, names and dimensions transformers.js reads."""

import json

import numpy as np
import onnx
import pytest
import torch

from hf_vanilla_transformer.cli.export_onnx import main
from hf_vanilla_transformer.engines.onnx import OnnxTranslator, is_onnx_folder
from hf_vanilla_transformer.export.onnx import export
from hf_vanilla_transformer.model.modeling_vanilla_transformer import paper_generation_config
from support.models import letter_tokenizer, tiny_model

SENTENCES = ["a b c d e f", "j i h", "b", "c c c c c c c c c c"]


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """A tiny model folder of ours (random weights: every one matters; 4 encoder heads, 2 decoder heads) and its
    ONNX export. Untrained, it never ends a sentence by itself, so every translation runs to its own limit."""
    folder = tmp_path_factory.mktemp("onnx")
    model = tiny_model(vocab_size=14, max_position_embeddings=128)
    with torch.no_grad():
        model.model.decoder.layers[1].self_attn_layer_norm.bias.normal_()  # biases are zero after initialisation
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(folder / "ours")
    letter_tokenizer().save_pretrained(folder / "ours")
    export(str(folder / "ours"), str(folder / "onnx"))
    return model, folder / "onnx"


def test_the_graphs_compute_our_logits_step_by_step_from_their_own_past(onnx_export):
    model, folder = onnx_export
    translator = OnnxTranslator(str(folder))
    batch = letter_tokenizer()(SENTENCES, return_tensors="np", padding=True)
    targets = np.array([[0, 5, 6, 7, 8, 9], [0, 9, 8, 7, 6, 5], [0, 4, 4, 4, 4, 4], [0, 13, 12, 11, 10, 9]])
    with torch.no_grad():
        expected = model(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
            decoder_input_ids=torch.from_numpy(targets),
        ).logits.numpy()
    (hidden,) = translator.encoder.run(None, dict(batch))
    past = {name: np.zeros((4, 2, 0, 16), np.float32) for name in translator.past_names}
    for position in range(targets.shape[1]):
        outputs = translator.decoder.run(
            None,
            {
                "input_ids": targets[:, position : position + 1],
                "encoder_attention_mask": batch["attention_mask"],
                "encoder_hidden_states": hidden,
                "use_cache_branch": np.array([position > 0]),
                **past,
            },
        )
        np.testing.assert_allclose(outputs[0][:, 0], expected[:, position], atol=1e-4, rtol=0, err_msg=str(position))
        past = dict(zip(translator.past_names, outputs[1:], strict=False))
        cross_attention = outputs[-1]  # the last layer's: each head's weights over the source sum to 1
        assert cross_attention.shape == (4, 2, 1, batch["input_ids"].shape[1])
        np.testing.assert_allclose(cross_attention.sum(-1), 1, atol=1e-5)
        padding = np.broadcast_to(batch["attention_mask"][:, None, None, :] == 0, cross_attention.shape)
        assert padding.any() and (cross_attention[padding] == 0).all()  # no weight on padding


@pytest.mark.parametrize("max_new_tokens", [None, 3])
def test_onnx_runtime_decodes_as_generate_greedy_each_sentence_to_its_limit(onnx_export, max_new_tokens):
    model, folder = onnx_export
    translator = OnnxTranslator(str(folder))
    batch = letter_tokenizer()(SENTENCES, return_tensors="np", padding=True)
    generated = translator.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens)
    with torch.no_grad():
        expected = model.generate(
            **{name: torch.from_numpy(value) for name, value in batch.items()},
            num_beams=1,
            **({"max_new_tokens": max_new_tokens} if max_new_tokens else {}),
        )[:, 1:]
    assert generated.tolist() == expected.tolist()
    lengths = (generated != 1).sum(-1)  # each sentence ends, with </s>, at its own source length + 50
    assert lengths.tolist() == ([3] * 4 if max_new_tokens else (batch["attention_mask"].sum(-1) + 50).tolist())
    assert translator.translate(
        SENTENCES, batch_size=3, max_new_tokens=max_new_tokens
    ) == letter_tokenizer().batch_decode(expected, skip_special_tokens=True)


def test_vanilla_translate_translates_the_folder_greedily_as_generate_does(onnx_export, tmp_path, capsys):
    from hf_vanilla_transformer.cli.translate import main as translate_main

    (tmp_path / "in.txt").write_text("\n".join([SENTENCES[0], "", *SENTENCES[1:]]) + "\n")
    outputs = []
    for folder, flags in (
        (onnx_export[1], []),
        (onnx_export[1].parent / "ours", ["--num_beams", "1", "--dtype", "float32"]),
    ):
        translate_main(["--model", str(folder), "--input", str(tmp_path / "in.txt"), "--max_new_tokens", "6", *flags])
        outputs.append(capsys.readouterr().out.splitlines())
    assert outputs[0] == outputs[1] and len(outputs[0]) == len(SENTENCES) + 1 and outputs[0][1] == ""


def test_the_int8_graphs_decode_close_to_float32(onnx_export):
    _, folder = onnx_export
    batch = letter_tokenizer()(SENTENCES, return_tensors="np", padding=True)
    float32, int8 = (OnnxTranslator(str(folder), quantized=quantized) for quantized in (False, True))
    (hidden32,), (hidden8,) = (translator.encoder.run(None, dict(batch)) for translator in (float32, int8))
    assert not np.array_equal(hidden8, hidden32) and np.corrcoef(hidden8.ravel(), hidden32.ravel())[0, 1] > 0.95
    assert int8.generate(batch["input_ids"], batch["attention_mask"], 5).shape == (4, 5)
    # the decoder's weights are int8, stored once for both branches of its If
    decoder = onnx.load(str(folder / "onnx" / "decoder_model_merged_quantized.onnx"))
    shared_types = {constant.data_type for constant in decoder.graph.initializer}
    assert (
        onnx.TensorProto.INT8 in shared_types
        and (folder / "onnx" / "decoder_model_merged_quantized.onnx").stat().st_size
        < (folder / "onnx" / "decoder_model_merged.onnx").stat().st_size
    )


def test_the_folder_is_a_marian_model_in_the_layout_transformers_js_reads(onnx_export):
    _, folder = onnx_export
    assert is_onnx_folder(str(folder))
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "marian" and config["architectures"] == ["MarianMTModel"]
    assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.py"))
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation.get("num_beams", 1) == 1 and generation["max_new_tokens_over_source"] == 50
    assert {path.name for path in (folder / "onnx").iterdir()} == {
        "encoder_model.onnx",
        "decoder_model_merged.onnx",
        "encoder_model_quantized.onnx",
        "decoder_model_merged_quantized.onnx",
    }
    decoder = onnx.load(str(folder / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)

    def dims(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    inputs = {value.name: dims(value) for value in decoder.graph.input}
    # transformers.js builds the first step's empty past from these: batch_size resolved, other names 0
    assert inputs["past_key_values.2.decoder.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["past_key_values.2.encoder.key"] == ["batch_size", 2, "encoder_past_sequence_length", 16]
    assert inputs["input_ids"] == ["batch_size", 1] and inputs["use_cache_branch"] == [1]
    outputs = [value.name for value in decoder.graph.output]
    assert outputs[:2] == ["logits", "present.0.decoder.key"] and outputs[-1] == "cross_attentions.2"
    # one If, its first step computing the cross-attention's keys and values, the later steps reading them
    (branch,) = decoder.graph.node
    then_branch, else_branch = (attribute.g for attribute in branch.attribute)
    read = {graph.name: {value for node in graph.node for value in node.input} for graph in (then_branch, else_branch)}
    assert branch.op_type == "If" and "encoder_hidden_states" in read["first_step"]
    assert "encoder_hidden_states" not in read["with_past"] and "past_key_values.2.encoder.value" in read["with_past"]
    card = (folder / "README.md").read_text()
    assert "Greedy decoding only" in card and "max_new_tokens" in card


def test_what_marian_cannot_compute_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    model = tiny_model(layer_norm_position="pre")
    model.save_pretrained(tmp_path / "ours")
    letter_tokenizer().save_pretrained(tmp_path / "ours")
    with pytest.raises(SystemExit) as exit:
        main(["--model", str(tmp_path / "ours"), "--output_dir", str(tmp_path / "onnx")])
    assert str(exit.value).startswith("vanilla-export-onnx: error: ") and "layer_norm_position='pre'" in str(exit.value)
    assert "\n" not in str(exit.value) and not (tmp_path / "onnx").exists()
