"""A demo page for a translation model trained with hf-vanilla-transformer: type a sentence, see its translation,
where the decoder looked in the source, and the beam search step by step.

    python demo/app.py --model runs/multi30k-small              # serves http://127.0.0.1:7860

As a Hugging Face Space (this folder, with README.md and requirements.txt) it serves the model named by the
Space's MODEL variable, a Hub id or a folder. Needs the [demo] extra: `pip install -e ".[demo]"`.

What a visitor can ask of the server is bounded: a text longer than CHARACTERS_PER_POSITION characters for each of
the model's positions is refused before it is tokenized; its picture is at most MAX_FIGURE_INCHES a side at DPI
whatever its tokens (PICTURE_NOTE says how, on the page); at most QUEUE_SIZE requests wait while one runs, and more
are refused; gradio deletes its copies of the pictures as DELETE_CACHE says, and takes no upload over MAX_FILE_SIZE;
and what a request leaves is freed and given back to the system as soon as its answer is made (`release_memory`).
"""

import argparse
import ctypes
import gc
import os
import sys

import gradio as gr
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from hf_vanilla_transformer.inspection.capture import decoding_steps, source_labels
from hf_vanilla_transformer.inspection.pictures import (
    DPI,
    LABELLED_TOKENS,
    MAX_FIGURE_INCHES,
    STEP_COLUMNS,
    decoded_attention_figure,
    steps_table,
)
from hf_vanilla_transformer.loading import load_model_and_tokenizer

EXAMPLES = ["A man is sleeping.", "Two dogs are playing in the snow.", "A woman in a red dress is singing."]
# the system's fonts: the default theme would fetch one from Google Fonts, and a demo must work offline
THEME = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
# A text is refused by its length in characters before it is tokenized: tokenizing takes time and memory in
# proportion to the text, and every other visitor waits meanwhile. The bound is a generous multiple of the model's
# positions, above the longest token of our BPE vocabularies and far above their characters per token on real text
# (docs/testing.md), so a text over it would have more tokens than the model has positions anyway; the token count
# after tokenizing stays the exact check.
CHARACTERS_PER_POSITION = 32
# Requests that may wait while one runs (gradio's queue runs one at a time: `default_concurrency_limit=1`); more
# are refused with gradio's "Queue is full" rather than lining up without end; --queue_size changes it.
QUEUE_SIZE = 20
# gradio serves each picture from a copy in its cache (GRADIO_TEMP_DIR), kept until the server stops unless told
# otherwise: (every 60 s, delete those older than 60 s) keeps the last two minutes' at most. A browser and
# gradio_client fetch a picture as soon as its answer comes.
DELETE_CACHE = (60, 60)
# the page takes no file, but gradio's upload route takes any, into its cache: none bigger than this
MAX_FILE_SIZE = "1kb"
# glibc's call that hands the free memory of every arena back to the system; None under another C library
MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform == "linux" else None
# what the picture shows of a long sentence: its size is bounded (inspection/pictures.py), and the page says how
PICTURE_NOTE = (
    f"The picture draws every token of both sentences. Past {LABELLED_TOKENS} tokens a side they share its size "
    f"and one in k is labelled, with its position, as the axis says; it is at most {MAX_FIGURE_INCHES * DPI:,} "
    "pixels a side, however long the sentence."
)


def build_demo(model_path: str, queue_size: int = QUEUE_SIZE) -> gr.Blocks:
    """`translation_page` for the model of a folder or a Hub id."""
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu")
    return translation_page(model, tokenizer, model_path, queue_size)


def translation_page(
    model, tokenizer, name: str, queue_size: int = QUEUE_SIZE, delete_cache: tuple[int, int] = DELETE_CACHE
) -> gr.Blocks:
    """The page: a text box and Translate; the translation, the encoder-decoder attention picture (last layer, mean
    over heads) and the beam search's steps. Its API: `/translate` (sentence -> those three). `queue_size` requests
    may wait while one runs; `delete_cache` is gr.Blocks' (frequency, age) for its copies of the pictures."""
    model.set_attn_implementation("eager")  # every request shows attention weights: switch once, not per request
    positions = model.config.max_position_embeddings
    max_characters = CHARACTERS_PER_POSITION * positions

    def translate(source: str):
        try:
            return answer(source)
        finally:  # its steps and figure are garbage now
            release_memory()

    def answer(source: str):
        if len(source) > max_characters:  # before anything reads the text (the browser's max_length binds no one)
            raise gr.Error(
                f"source: {len(source):,} characters, more than the {max_characters:,} this demo reads "
                f"({CHARACTERS_PER_POSITION} for each of the model's {positions:,} positions)",
                print_exception=False,
            )
        if not source.strip():  # as vanilla-translate and the pipeline: an empty sentence, an empty translation
            return "", None, []
        try:
            # one search: the picture is drawn from the last-layer attention rows its steps recorded, not from a
            # second search and a pass that returns every layer's attentions
            steps, translation = decoding_steps(
                model, tokenizer, source, num_beams=model.generation_config.num_beams or 1
            )
            picture = pixels(decoded_attention_figure(steps, source_labels(tokenizer, model, source)))
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        return translation, picture, steps_table(steps)

    with gr.Blocks(title="Attention Is All You Need: a translator", delete_cache=delete_cache) as demo:
        gr.Markdown(f"# Translate with the original Transformer\nModel: `{name}`")
        source = gr.Textbox(label="Sentence", placeholder=EXAMPLES[0], max_length=max_characters, elem_id="source")
        button = gr.Button("Translate", variant="primary", elem_id="translate")
        translation = gr.Textbox(label="Translation", interactive=False, elem_id="translation")
        picture = gr.Image(
            label="Where the decoder looked (encoder-decoder attention)", format="png", elem_id="attention"
        )
        gr.Markdown(PICTURE_NOTE, elem_id="picture-note")
        steps = gr.Dataframe(headers=STEP_COLUMNS, label="Beam search, step by step", elem_id="steps")
        gr.Examples(EXAMPLES, inputs=source)
        outputs = [translation, picture, steps]
        button.click(translate, inputs=source, outputs=outputs, api_name="translate")
        source.submit(translate, inputs=source, outputs=outputs, api_visibility="private")
    return demo.queue(max_size=queue_size, default_concurrency_limit=1)


def release_memory() -> None:
    """Free what a request left and give it back to the system: matplotlib's figure is a cycle of objects, which only
    a full garbage collection frees, and glibc keeps what a thread freed in that thread's arena, for the thread to
    reuse; gradio answers on several threads, so long requests left gigabytes held between them."""
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def pixels(figure) -> np.ndarray:
    """The figure drawn, as RGBA pixels: gradio writes the one file it serves, in its cache, which `delete_cache`
    empties; a file of our own would be a second copy that nothing deletes."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.array(canvas.buffer_rgba())


def launch(demo: gr.Blocks, host: str, port: int, **options) -> None:
    """Serve `demo` on `host`:`port` with the page's theme and MAX_FILE_SIZE; `options` are more of launch()'s."""
    demo.launch(server_name=host, server_port=port, theme=THEME, max_file_size=MAX_FILE_SIZE, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("MODEL"), help="A model folder or Hub id (env MODEL).")
    # a Space sets GRADIO_SERVER_NAME=0.0.0.0; anywhere else the page is served to this machine only
    host = os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")
    parser.add_argument("--host", default=host, help="Address to serve on.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument(
        "--queue_size", type=int, default=QUEUE_SIZE, help="Requests that may wait while one runs; more are refused."
    )
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("give --model (a folder or Hub id) or set MODEL")
    if args.queue_size < 1:
        parser.error(f"--queue_size {args.queue_size} must be at least 1")
    try:
        demo = build_demo(args.model, args.queue_size)
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    # what is loaded now lives as long as the server: out of the collector's sight, so that the collection after
    # each request looks at that request's objects only (milliseconds, not a quarter of a second)
    gc.collect()
    gc.freeze()
    launch(demo, args.host, args.port)


if __name__ == "__main__":
    main()
