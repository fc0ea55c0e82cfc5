"""The files a model folder holds, by format, named here once: ours (`save_pretrained`), the CTranslate2 export's
and the ONNX export's; and, from those names, the one list of a folder's files for each purpose: what a Hub download
takes (`MODEL_FILES`) and what a push uploads (`UPLOADED`); and whether a folder is of an export's format."""

import os

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"  # tokenizers' one file: vocabulary, merges, normalization
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CTRANSLATE2_WEIGHTS = "model.bin"  # CTranslate2's one file of weights (and its model specification)
ONNX_FOLDER = "onnx"  # the graphs' folder, in transformers.js's layout
QUANTIZED = "_quantized"  # transformers.js's suffix for int8 graphs (its dtype "q8")
ENCODER_GRAPH, DECODER_GRAPH = "encoder_model", "decoder_model_merged"  # the ONNX graphs, without ".onnx"
CARD_NAME = "README.md"  # the model card, as the Hub shows it
RUN_RECORD = "run_record.json"  # what the run that trained the model did (training/run.py), which its card shows
PREDICTIONS_FILE = "generated_predictions.txt"  # the test set's translations, named as transformers' example names them

# What the model folders we load hold (ours, and our CTranslate2 and ONNX exports): a Hub download takes these files
# and nothing else. No code (no folder's code is ever run here), no pickles, no checkpoints or training state.
MODEL_FILES = [
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    WEIGHTS_NAME,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    "special_tokens_map.json",
    CTRANSLATE2_WEIGHTS,
    "shared_vocabulary.*",
    f"{ONNX_FOLDER}/*.onnx",
    f"{ONNX_FOLDER}/*.onnx_data",
]


# What a model folder is, ours (run_translation.py) or an export of it: the only files a push uploads. A pattern
# matches at its own depth, a top-level name or one under onnx/ (huggingface_hub's allow_patterns let "*" cross a
# "/": "*.safetensors" would take checkpoint-5/model.safetensors). Everything else stays local: the Trainer's state
# (training_args.bin, a pickle that holds --hub_token; trainer_state.json; checkpoint-N/ with its optimizer and RNG
# states, and the .deleting-checkpoint-N/ a killed rotation leaves), TensorBoard's runs/, hidden files (.env, .git/)
# and an interrupted write's temporary files (.NAME.XXXX.partial). A link counts as the file it leads to (model_files).
UPLOADED = (
    # the weights: ours and the Marian export's (sharded, with an index, when large), CTranslate2's
    "*.safetensors",
    "*.safetensors.index.json",
    CTRANSLATE2_WEIGHTS,
    # the model's and the generation's configs
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    # the tokenizer: ours (tokenizers' file), Marian's own (two SentencePiece models and a vocabulary), and
    # CTranslate2's vocabularies (shared_, or source_ and target_; JSON, or text in older releases)
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    "special_tokens_map.json",
    "*.spm",
    "vocab.json",
    "*_vocabulary.json",
    "*_vocabulary.txt",
    # the code the config names for trust_remote_code (auto_map, custom_pipelines)
    "configuration_*.py",
    "modeling_*.py",
    "pipeline_*.py",
    # the card, and the pictures a card shows (attention.png)
    CARD_NAME,
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.svg",
    # the results: the scores, the record the card is written from, the test set's translations
    "*_results.json",
    RUN_RECORD,
    PREDICTIONS_FILE,
    # the ONNX export's graphs in transformers.js's layout, and beside one over 2 GB its weights
    f"{ONNX_FOLDER}/*.onnx",
    f"{ONNX_FOLDER}/*.onnx_data",
)


def is_ctranslate2_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CTRANSLATE2_WEIGHTS))


def is_onnx_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ONNX_FOLDER, f"{DECODER_GRAPH}.onnx"))
