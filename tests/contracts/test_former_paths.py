"""The former import paths (hf_vanilla_transformer/tools/, kept for one release; CHANGELOG.md): every public name
each module defined before the package was laid out a folder a job still imports from it, and is the object its new
home holds."""

import importlib
import warnings

import pytest
import torch

from hf_vanilla_transformer.model.modeling_vanilla_transformer import length_limits

# each former module and the names it defined
FORMER = {
    "alignment": [
        "DEFAULT_HEADS",
        "DEFAULT_LAYER",
        "DEFAULT_METHOD",
        "DEFAULT_TARGET_POSITION",
        "METHODS",
        "Method",
        "NEIGHBOURS",
        "TARGET_POSITIONS",
        "TargetPosition",
        "WORD",
        "WordAttention",
        "align",
        "batch_word_attentions",
        "check_setting",
        "encode_lines",
        "format_alignment",
        "grow_diag_final_and",
        "most_attended",
        "parse_alignment",
        "pooling",
        "token_words",
        "word_attention",
        "word_attentions",
    ],
    "avoid": ["AvoidLogitsProcessor", "BYTES_PER_CHARACTER", "DECODE", "ctranslate2_suppress_sequences"],
    "card": [
        "LOCAL_PICTURE",
        "MODEL_CARD_TEMPLATE",
        "card_title",
        "render_model_card",
        "replace_section",
        "write_export_card",
        "write_model_card",
    ],
    "constraints": [
        "BEAM_SEARCH_PENALTY",
        "Candidates",
        "ConstrainedBeamSearchOutput",
        "ConstraintState",
        "ConstraintTables",
        "Finished",
        "Hypotheses",
        "Running",
        "Settings",
        "allocate_beam",
        "allowed_tokens",
        "as_phrases",
        "best_hypotheses",
        "bounded_by",
        "can_improve",
        "check_constraints",
        "constrained_beam_search",
        "constrained_beams",
        "meet_constraints",
        "search",
        "source_limits",
        "step_candidates",
        "update_finished",
    ],
    "ctranslate2_runtime": [
        "COMPUTE_TYPES",
        "CTranslate2Translator",
        "ctranslate2_device",
        "token_attention_alignment",
    ],
    "ensemble": [
        "EnsembleCache",
        "EnsembleEncoder",
        "MEMBERS_SHARE",
        "MembersDiffer",
        "SHARED_CONFIG",
        "SHARED_TOKENIZER_IDS",
        "TranslationEnsemble",
        "check_members",
        "config_difference",
        "load_ensemble",
        "refuse_member_details",
        "tokenizer_difference",
    ],
    "export_ctranslate2": [
        "CARRIED_FILES",
        "CTRANSLATE2_WEIGHTS",
        "QUANTIZATIONS",
        "check_ctranslate2_expressible",
        "export",
        "is_ctranslate2_folder",
        "usage",
        "write_card",
    ],
    "export_marian": [
        "MARIAN_LAYER_NORM_EPS",
        "check_marian_expressible",
        "copy_attention",
        "copy_layer",
        "copy_layer_norm",
        "export",
        "marian_config",
        "marian_feature_order",
        "marian_generation_config",
        "marian_model",
        "read_json",
        "usage",
        "write_card",
    ],
    "export_onnx": [
        "DecoderStepGraph",
        "EncoderGraph",
        "ONNX_FOLDER",
        "QUANTIZED",
        "branch_graph",
        "constant_key",
        "export",
        "export_graphs",
        "greedy_generation_config",
        "merge_decoders",
        "output_names",
        "past_names",
        "quantize",
        "usage",
    ],
    "hub": [
        "UNPRINTABLE_IN_A_FILE_NAME",
        "UPLOADED",
        "card_for",
        "check_hub_login",
        "check_printable",
        "human_size",
        "is_model_file_name",
        "model_files",
        "paths_in_brief",
        "push_model_folder",
    ],
    "inspection": [
        "ATTENTION_KINDS",
        "AttentionMaps",
        "DecodingStep",
        "Hypothesis",
        "StepRows",
        "TokensSoFar",
        "attention_maps",
        "check_top_k",
        "decoding_steps",
        "encode_sentence",
        "on_the_eager_path",
        "source_labels",
        "teacher_forced_steps",
        "token_labels",
        "up_to_end",
        "winning_path",
    ],
    "markdown": [
        "INLINE_SPECIALS",
        "LINE_START",
        "code_literal",
        "fenced_block",
        "inline_code",
        "longest_backtick_run",
        "markdown_text",
    ],
    "onnx_runtime": ["OnnxTranslator", "is_onnx_folder"],
    "prefix": ["PrefixLogitsProcessor", "prefix_token_ids"],
    "scoring": [
        "ChunkScorer",
        "LOGITS_PER_CHUNK",
        "check_pairs",
        "checked_ids",
        "ctranslate2_forced_decoding",
        "exact_scores_need_same_shapes",
        "forced_decoding",
        "is_given",
        "padded",
        "read_hypotheses",
        "rescored",
        "score_lines",
        "score_translations",
        "scored_ids",
        "scored_pairs",
    ],
    "steering_files": [
        "INVISIBLE_CATEGORIES",
        "MARKUP",
        "check_line_counts",
        "check_steering_texts",
        "checked_phrase",
        "checked_text",
        "logger",
        "numbered_steering_lines",
        "read_avoid",
        "read_constraints",
        "read_lines",
        "read_phrase_list",
        "read_prefixes",
        "read_steering_files",
        "warn_about_blank_lines",
    ],
    "translate": [
        "ModelTranslator",
        "NBEST_SEPARATOR",
        "OUTPUT_FORMATS",
        "SEARCH_MEMORY",
        "check_request",
        "check_steering",
        "check_steering_of",
        "format_translations",
        "hypothesis_fields",
        "load_translator",
        "logger",
        "token_counts",
        "translate_lines",
        "translate_lines_in_full",
        "translation_dtype",
        "translator_kind",
        "translator_loader",
        "write_lines",
    ],
    "translator": ["Hypothesis", "Steering", "SteeringError", "Translator", "length_limit"],
    "visualize": [
        "AXIS_TITLES",
        "CARD_PICTURE",
        "CJK_FONTS",
        "COLOR_LEGEND",
        "COLOR_MAP",
        "DPI",
        "KIND_EXPLANATIONS",
        "LABELLED_TOKENS",
        "MAX_FIGURE_INCHES",
        "MISSING_GLYPH",
        "OUTCOMES_LEGEND",
        "PAGE_TEMPLATE",
        "SO_FAR_CHARACTERS",
        "STEP_COLUMNS",
        "TOKEN_INCHES",
        "TREE_LEGEND",
        "WHERE_THE_DECODER_LOOKED",
        "alternatives_text",
        "attention_figure",
        "attention_page",
        "axis_labels",
        "beam_tree",
        "check_selection",
        "color_stops",
        "cross_attention_figure",
        "decoded_attention_figure",
        "font_families",
        "format_steps",
        "installed_cjk_fonts",
        "is_cjk",
        "kind_figure",
        "kind_title",
        "labelled_ticks",
        "logger",
        "outcomes",
        "page_data",
        "quoted",
        "save_figure",
        "so_far_text",
        "steps_html",
        "steps_table",
        "warning_lines",
        "write_attention_pictures",
        "write_card_picture",
    ],
    "words": [
        "CLOSING",
        "OPENING",
        "PART_OF_A_CHARACTER",
        "PHRASE_MATCHES",
        "Phrase",
        "PhraseMatch",
        "SENTENCE_ENDS",
        "TokenWords",
        "UNSPACED_CHARACTER",
        "UNSPACED_SCRIPTS",
        "WORD_CHARACTER",
        "encode_phrases",
        "holds",
        "is_word_character",
        "joined",
    ],
}

MOVED = {
    ("translate", "load_translator"): "hf_vanilla_transformer.engines.registry",
    ("translate", "ModelTranslator"): "hf_vanilla_transformer.engines.generate",
    ("translate", "format_translations"): "hf_vanilla_transformer.translation.output",
    ("translate", "translate_lines"): "hf_vanilla_transformer.translation.lines",
    ("translator", "Steering"): "hf_vanilla_transformer.decoding.request",
    ("scoring", "score_translations"): "hf_vanilla_transformer.decoding.forced_decoding",
    ("inspection", "attention_maps"): "hf_vanilla_transformer.inspection.capture",
    ("export_onnx", "export"): "hf_vanilla_transformer.export.onnx",
}


@pytest.mark.parametrize("module", sorted(FORMER))
def test_every_public_name_of_a_former_module_still_imports_from_it(module):
    former = importlib.import_module(f"hf_vanilla_transformer.tools.{module}")
    assert [name for name in FORMER[module] if not hasattr(former, name)] == []


@pytest.mark.parametrize(("module", "name"), sorted(MOVED))
def test_a_former_name_is_the_object_its_new_home_holds(module, name):
    former = importlib.import_module(f"hf_vanilla_transformer.tools.{module}")
    assert getattr(former, name) is getattr(importlib.import_module(MOVED[module, name]), name)


def test_the_former_one_sentence_length_limit_gives_what_length_limits_gives():
    from hf_vanilla_transformer.tools.translator import length_limit

    for source, cap in [(10, None), (300, None), (10, 20), (10, 0)]:
        expected = int(length_limits(torch.tensor([source]), 256, 50, cap)[0])
        assert length_limit(source, 256, 50, cap) == expected
    assert [length_limit(10, 256, 50), length_limit(300, 256, 50), length_limit(10, 256, None, 20)] == [60, 255, 20]


def test_the_former_method_names_warn_and_give_what_the_new_ones_give():
    from hf_vanilla_transformer.decoding.ensemble import TranslationEnsemble
    from hf_vanilla_transformer.engines.base import Translator
    from support.models import EOS, PAD, tiny_model

    ids = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    ensemble = TranslationEnsemble([tiny_model()])
    with pytest.warns(FutureWarning, match="length_limit_processors"):
        (former,) = ensemble.source_length_limit(batch)
    (limit,) = ensemble.length_limit_processors(batch)
    assert former.max_new_tokens.tolist() == limit.max_new_tokens.tolist() == [4 + 50, 2 + 50]

    translator = Translator()
    translator.max_positions, translator.max_new_tokens_over_source = 64, 50
    with pytest.warns(FutureWarning, match="length_limits"):
        assert [translator.length_limit(5), translator.length_limit(40), translator.length_limit(5, 20)] == [55, 63, 20]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert translator.length_limits([5, 40], 20) == [20, 20]
