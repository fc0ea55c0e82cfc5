"""hf_vanilla_transformer.engines.generate: our model's engine searches a long n-best list a few sentences at a time,
within its memory, and refuses one that cannot fit."""

from hf_vanilla_transformer.decoding.request import Steering
from hf_vanilla_transformer.engines.registry import load_translator
from hf_vanilla_transformer.translation.lines import translate_lines_in_full
from support.steering import SOURCES, translate_input


def test_a_long_n_best_list_is_searched_a_few_sentences_at_a_time_and_one_that_cannot_fit_is_refused(
    folders, capsys, monkeypatch
):
    """The search's memory is bounded: with room for 4 sentences' hypotheses in `SEARCH_MEMORY`, 32 sentences go
    through 8 searches of 4 (the encoder sees those batches, and the forced decoding that scores their 40 hypotheses
    each), and every sentence gets its list; a request that cannot fit one sentence on this machine is refused,
    naming the memory it needs."""
    from hf_vanilla_transformer.engines import generate

    translator = load_translator(folders["first"], "cpu", "float32")
    lines = [source for source in SOURCES if source] * 8
    longest = max(len(ids) for ids in translator.tokenizer(lines)["input_ids"])
    monkeypatch.setattr(generate, "SEARCH_MEMORY", 4 * translator.search_bytes(1, longest, 40))
    batches = []
    hook = translator.model.get_encoder().register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        found = translate_lines_in_full(
            translator, lines, 32, {"num_beams": 40}, False, Steering(n_best=40, scores=True)
        )
    finally:
        hook.remove()
    assert batches == [4, 4 * 40] * 8
    assert [len(hypotheses) for hypotheses in found] == [40] * 32
    status, _, err = translate_input(capsys, folders, "--n_best", "100000000")
    assert status == 1 and "hypotheses (--n_best, --num_beams) needs about" in err and "GiB" in err, err
