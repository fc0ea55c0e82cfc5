"""`pipeline("translation")` for our models, as a custom transformers pipeline, the model's scores of what
`generate()` returned (`sequence_scores`), and the cut of a very long line before it is tokenized
(`cut_long_lines`), which vanilla-translate and vanilla-score make too.

transformers 5 removed its built-in `translation` and `text2text-generation` pipelines. This class gives them back
for seq2seq models the way transformers supports custom pipelines: every saved model folder carries this file and
names it in `config.custom_pipelines`, so that

    pipeline("translation", model=folder, trust_remote_code=True)        # the package need not be installed
    pipeline("translation", model=folder, pipeline_class=TranslationPipeline)   # with the package, no remote code
    TranslationPipeline(model=model, tokenizer=tokenizer)

all return what the old pipeline did: `[{"translation_text": ...}]`. Decoding defaults to the model's generation
config (for our models the paper's: beam 4, length penalty 0.6, at most source length + 50 tokens); any
`generate()` argument passes through. `return_scores=True` adds the model's scores of each translation: `"score"`
(what beam search ranks by), `"log_probability"` and `"token_log_probs"` (`sequence_scores`). This file imports
nothing of ours: it is run as remote code.
"""

import math
import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class SequenceScore:
    """The model's score of one target sequence y for a source x: what fairseq's `--score-reference`, marian-scorer
    and CTranslate2's `score_batch` report."""

    token_ids: list[int]  # y's tokens, `</s>` included when y ends with it; no `<s>`, no padding
    token_log_probs: list[float]  # log P(y_t | y_<t, x) for each of them: the model's own log-softmax
    log_probability: float  # their sum, log P(y | x)
    score: float  # log P(y | x) / |y|^length_penalty: what transformers' beam search ranks hypotheses by


def scored(
    token_ids: list[int], token_log_probs: list[float], length_penalty: float | None, score: float | None = None
) -> SequenceScore:
    """The `SequenceScore` of these tokens and log-probabilities; `score` (default: `length_normalized`) given where
    beam search has ranked the sequence itself."""
    log_probability = math.fsum(token_log_probs)
    if score is None:
        score = length_normalized(log_probability, len(token_ids), length_penalty)
    return SequenceScore(token_ids, token_log_probs, log_probability, score)


def length_normalized(log_probability: float, length: int, length_penalty: float | None) -> float:
    """transformers' beam search score of a finished hypothesis: its log-probability / |y|^α, where |y| counts the
    tokens generated after the decoder prompt, `</s>` included (`length_penalty` None: transformers' default 1)."""
    return log_probability / length ** (1.0 if length_penalty is None else length_penalty)


def sequence_scores(
    model, output, length_penalty: float | None = None, eos_token_id: int | list[int] | None = None
) -> list[SequenceScore]:
    """The model's scores of each sequence `model.generate(..., return_dict_in_generate=True, output_logits=True,
    output_scores=True)` returned (greedy, sampling or beam search, `num_return_sequences` rows per source, in the
    order of `output.sequences`).

    A token's log-probability is the model's own log-softmax of its raw logits, not of the scores logits processors
    changed: a token a processor forced (a prefix, `</s>` at the length limit) carries the probability the model
    gives it. The tokens are those generated after the decoder prompt, up to the first `</s>` (`eos_token_id`,
    default the model's generation config's). `score` is beam search's own `sequences_scores` where there is one,
    else the same formula, `length_normalized`, with `length_penalty` (default the model's generation config's): the
    same value for the same hypothesis unless a processor changed its tokens' scores.
    """
    if getattr(output, "logits", None) is None:
        raise ValueError("sequence_scores needs generate(..., return_dict_in_generate=True, output_logits=True)")
    generation = model.generation_config
    eos_token_id = generation.eos_token_id if eos_token_id is None else eos_token_id
    ends = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [], dtype=torch.long)
    length_penalty = generation.length_penalty if length_penalty is None else length_penalty
    beam_indices = getattr(output, "beam_indices", None)
    log_probs = model.compute_transition_scores(output.sequences, output.logits, beam_indices, normalize_logits=True)
    generated = output.sequences[:, output.sequences.shape[1] - log_probs.shape[1] :].cpu()
    ranked = getattr(output, "sequences_scores", None)
    scores = []
    for row, (tokens, token_log_probs) in enumerate(zip(generated, log_probs.cpu(), strict=True)):
        length = generated_length(tokens, ends)
        score = None if ranked is None else float(ranked[row])
        scores.append(scored(tokens[:length].tolist(), token_log_probs[:length].tolist(), length_penalty, score))
    return scores


def generated_length(tokens: torch.Tensor, ends: torch.Tensor) -> int:
    """The tokens of a generated row up to its first end token, that included; all of them if none ends it (it
    stopped at the length limit): generate() pads a finished row after its end."""
    ended = torch.isin(tokens, ends).nonzero()
    return int(ended[0, 0]) + 1 if len(ended) else len(tokens)


def longest_token(tokenizer) -> int:
    """The most characters a token of the tokenizer's vocabulary is spelled with: the most characters of text one
    token stands for where the tokenizer spells every character (a byte-level BPE spells each byte as one character,
    and a character is one byte or more)."""
    return max(map(len, tokenizer.get_vocab()))


def cut_long_lines(tokenizer, lines: list[str], positions: int, target: bool = False) -> list[str]:
    """`lines`, each cut to a start that holds more than `positions` tokens where it is much longer (`target`: as
    the tokenizer tokenizes targets): only a line's first `positions` tokens can be used, and tokenizing all of a
    10 MB line to find them takes seconds and gigabytes. A line is cut only when it has more characters than
    `positions` times the vocabulary's longest token (`longest_token`: a token takes at most that many, so a shorter
    line cannot hold more than `positions` tokens), and at a space, so that the words before the cut are tokenized
    as in the whole line; a word longer than half the cut is cut inside (its last tokens may then differ from the
    whole word's), or a line of one long word would be tokenized whole. Where spaces or characters that make no
    token leave the cut short of `positions` tokens, it doubles until it is not: a tokenizer that spells every
    character (byte-level BPE) never sees more than twice `positions` times the longest token, but a word-level
    vocabulary's unknown word is one token however long."""
    if all(len(line) <= positions for line in lines):  # within any cut (a token spells a character at least)
        return list(lines)
    characters = positions * longest_token(tokenizer)
    return [cut_long_line(tokenizer, line, positions, characters, target) for line in lines]


def cut_long_line(tokenizer, line: str, positions: int, characters: int, target: bool = False) -> str:
    while characters < len(line):
        cut = line[:characters]
        last_word = None if line[characters].isspace() else re.search(r"\s\S*\Z", cut)
        if last_word is not None and last_word.start() >= characters // 2:  # it splits a short word: that goes, whole
            cut = cut[: last_word.start()]
        if len((tokenizer(text_target=cut) if target else tokenizer(cut))["input_ids"]) > positions:
            return cut
        characters *= 2
    return line


class TranslationPipeline(Pipeline):
    """Translate text with a sequence-to-sequence model: one `{"translation_text": ...}` per returned sequence, with
    the model's scores of it when `return_scores=True`."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def __init__(self, *args, task: str = "translation", **kwargs):
        super().__init__(*args, task=task, **kwargs)

    def _sanitize_parameters(
        self, truncation=None, clean_up_tokenization_spaces=None, return_scores=None, **generate_kwargs
    ):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        forward_params, postprocess_params = dict(generate_kwargs), {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if return_scores is not None:
            forward_params["return_scores"] = postprocess_params["return_scores"] = return_scores
        return preprocess_params, forward_params, postprocess_params

    def __call__(self, text: str | list[str], **kwargs):
        """Translate `text` (a string or a list of strings; a list is batched with `batch_size`). Whitespace around
        a sentence is left out, and an empty sentence gets an empty translation.

        A string gives a list with one dict per returned sequence; a list of strings gives one such list per
        string, flattened to one dict per string when each has a single translation (as transformers 4 did).
        `return_scores=True` adds to each dict the model's scores of that translation (`SequenceScore`): `"score"`,
        what beam search ranks by (log-probability / length^length_penalty), `"log_probability"`, and
        `"token_log_probs"`, one per token up to `</s>`; an empty sentence, not translated, gets None for each.
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
        empty = {"translation_text": ""}
        if kwargs.get("return_scores"):
            empty.update(score=None, log_probability=None, token_log_probs=None)
        count = kwargs.get("num_return_sequences") or 1
        # a list and dicts of its own for each blank text: a caller may edit what it is given
        return [[dict(empty) for _ in range(count)] if is_blank else next(translated) for is_blank in blank]

    def preprocess(self, text: str, truncation: bool = True):
        if not isinstance(text, str):
            raise ValueError(f"TranslationPipeline translates strings, got {type(text).__name__}")
        text = text.strip()  # whitespace around a sentence is not part of it (a leading space changes the tokens)
        # the model's positions bound the source too, where the tokenizer's model_max_length is unset or larger
        positions = getattr(self.model.config, "max_position_embeddings", None)
        max_length = min(filter(None, (self.tokenizer.model_max_length, positions)), default=None)
        if max_length is not None and truncation not in (False, "do_not_truncate"):
            (text,) = cut_long_lines(self.tokenizer, [text], max_length)  # only its first max_length tokens are kept
        return self.tokenizer(text, return_tensors="pt", truncation=truncation, max_length=max_length)

    def _forward(self, model_inputs, return_scores: bool = False, **generate_kwargs):
        input_count = model_inputs["input_ids"].shape[0]
        if return_scores:  # the raw logits too: the scores are the model's own, not the logits processors'
            generate_kwargs.update(return_dict_in_generate=True, output_logits=True, output_scores=True)
        output = self.model.generate(**model_inputs, **generate_kwargs)
        output_ids = output.sequences if return_scores else output
        # generate() returns num_return_sequences rows per input: group them so the pipeline unbatches per input
        grouped = {"output_ids": output_ids.reshape(input_count, -1, output_ids.shape[-1])}
        if return_scores:
            length_penalty, eos_token_id = generate_kwargs.get("length_penalty"), generate_kwargs.get("eos_token_id")
            scores = sequence_scores(self.model, output, length_penalty, eos_token_id)
            per_input = len(scores) // input_count
            grouped["scores"] = [scores[start : start + per_input] for start in range(0, len(scores), per_input)]
        return grouped

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool = False, return_scores: bool = False):
        output_ids = model_outputs["output_ids"]
        if output_ids.dim() == 3:
            output_ids = output_ids[0]
        translations = [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in torch.as_tensor(output_ids)
        ]
        if return_scores:
            scores = model_outputs["scores"]
            # a batch unbatched by the pipeline gives this input's list; a batch of one comes whole, a list of lists
            if isinstance(scores[0], list):
                scores = scores[0]
            for translation, score in zip(translations, scores, strict=True):
                translation.update(
                    score=score.score, log_probability=score.log_probability, token_log_probs=score.token_log_probs
                )
        return translations
