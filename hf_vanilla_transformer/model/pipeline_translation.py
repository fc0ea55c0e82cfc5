"""`pipeline("translation")` for our models, as a custom transformers pipeline.

transformers 5 removed its built-in `translation` and `text2text-generation` pipelines. This class gives them back
for seq2seq models the way transformers supports custom pipelines: every saved model folder carries this file and
names it in `config.custom_pipelines`, so that

    pipeline("translation", model=folder, trust_remote_code=True)        # the package need not be installed
    pipeline("translation", model=folder, pipeline_class=TranslationPipeline)   # with the package, no remote code
    TranslationPipeline(model=model, tokenizer=tokenizer)

all return what the old pipeline did: `[{"translation_text": ...}]`. Decoding defaults to the model's generation
config (for our models the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens); any
`generate()` argument passes through. This file imports nothing of ours: it is run as remote code.
"""

import torch
from transformers import Pipeline

# What config.custom_pipelines holds for this pipeline (the format `Pipeline.save_pretrained` writes).
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_translation.TranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


class TranslationPipeline(Pipeline):
    """Translate text with a sequence-to-sequence model: one `{"translation_text": ...}` per returned sequence."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def __init__(self, *args, task: str = "translation", **kwargs):
        super().__init__(*args, task=task, **kwargs)

    def _sanitize_parameters(self, truncation=None, clean_up_tokenization_spaces=None, **generate_kwargs):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, text: str | list[str], **kwargs):
        """Translate `text` (a string or a list of strings; a list is batched with `batch_size`). Whitespace around
        a sentence is left out, and an empty sentence gets an empty translation.

        A string gives a list with one dict per returned sequence; a list of strings gives one such list per
        string, flattened to one dict per string when each has a single translation (as transformers 4 did).
        """
        if isinstance(text, str):
            return self._translate([text], **kwargs)[0]
        if isinstance(text, list):
            result = self._translate(text, **kwargs)
            if all(len(translations) == 1 for translations in result):
                return [translations[0] for translations in result]
            return result
        return super().__call__(text, **kwargs)  # a generator or a dataset: the Pipeline's own streaming

    def _translate(self, texts: list[str], **kwargs) -> list[list[dict]]:
        """The translations of each text. A blank text gets an empty translation without decoding: for a source
        that is only `</s>` the model would invent a sentence."""
        blank = [isinstance(text, str) and not text.strip() for text in texts]
        sentences = [text for text, is_blank in zip(texts, blank, strict=True) if not is_blank]
        translated = iter(super().__call__(sentences, **kwargs) if sentences else ())
        empty = [{"translation_text": ""}] * (kwargs.get("num_return_sequences") or 1)
        return [empty if is_blank else next(translated) for is_blank in blank]

    def preprocess(self, text: str, truncation: bool = True):
        if not isinstance(text, str):
            raise ValueError(f"TranslationPipeline translates strings, got {type(text).__name__}")
        text = text.strip()  # whitespace around a sentence is not part of it (a leading space changes the tokens)
        # the model's positions bound the source too, where the tokenizer's model_max_length is unset or larger
        positions = getattr(self.model.config, "max_position_embeddings", None)
        max_length = min(filter(None, (self.tokenizer.model_max_length, positions)), default=None)
        return self.tokenizer(text, return_tensors="pt", truncation=truncation, max_length=max_length)

    def _forward(self, model_inputs, **generate_kwargs):
        input_count = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        # generate() returns num_return_sequences rows per input: group them so the pipeline unbatches per input
        return {"output_ids": output_ids.reshape(input_count, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool = False):
        output_ids = model_outputs["output_ids"]
        if output_ids.dim() == 3:
            output_ids = output_ids[0]
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in torch.as_tensor(output_ids)
        ]
