"""A demo page for a translation model trained with hf-vanilla-transformer: type a sentence, see its translation,
where the decoder looked in the source, and the beam search step by step.

    python demo/app.py --model runs/multi30k-small              # serves http://127.0.0.1:7860

As a Hugging Face Space (this folder, with README.md and requirements.txt) it serves the model named by the
Space's MODEL variable, a Hub id or a folder. Needs the [demo] extra: `pip install -e ".[demo]"`.
"""

import argparse
import os
import tempfile
import uuid

import gradio as gr

from hf_vanilla_transformer.loading import load_model_and_tokenizer
from hf_vanilla_transformer.tools.inspection import attention_maps, decoding_steps
from hf_vanilla_transformer.tools.visualize import STEP_COLUMNS, cross_attention_figure, save_figure, steps_table

EXAMPLES = ["A man is sleeping.", "Two dogs are playing in the snow.", "A woman in a red dress is singing."]
# the system's fonts: the default theme would fetch one from Google Fonts, and a demo must work offline
THEME = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def build_demo(model_path: str) -> gr.Blocks:
    """The page: a text box and Translate; the translation, the encoder-decoder attention picture (last layer, mean
    over heads) and the beam search's steps. Its API: `/translate` (sentence -> those three)."""
    model, tokenizer = load_model_and_tokenizer(model_path, "cpu")  # a folder or a Hub id
    model.set_attn_implementation("eager")  # every request shows attention weights: switch once, not per request
    pictures = tempfile.mkdtemp(prefix="vanilla-demo-")

    def translate(source: str):
        if not source.strip():  # as vanilla-translate and the pipeline: an empty sentence, an empty translation
            return "", None, []
        try:
            maps = attention_maps(model, tokenizer, source)
            steps, _ = decoding_steps(model, tokenizer, source, num_beams=model.generation_config.num_beams or 1)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        picture = save_figure(cross_attention_figure(maps), os.path.join(pictures, f"{uuid.uuid4().hex}.png"))
        return maps.translation, picture, steps_table(steps)

    with gr.Blocks(title="Attention Is All You Need: a translator") as demo:
        gr.Markdown(f"# Translate with the original Transformer\nModel: `{model_path}`")
        source = gr.Textbox(label="Sentence", placeholder=EXAMPLES[0], elem_id="source")
        button = gr.Button("Translate", variant="primary", elem_id="translate")
        translation = gr.Textbox(label="Translation", interactive=False, elem_id="translation")
        picture = gr.Image(label="Where the decoder looked (encoder-decoder attention)", elem_id="attention")
        steps = gr.Dataframe(headers=STEP_COLUMNS, label="Beam search, step by step", elem_id="steps")
        gr.Examples(EXAMPLES, inputs=source)
        outputs = [translation, picture, steps]
        button.click(translate, inputs=source, outputs=outputs, api_name="translate")
        source.submit(translate, inputs=source, outputs=outputs, api_visibility="private")
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("MODEL"), help="A model folder or Hub id (env MODEL).")
    # a Space sets GRADIO_SERVER_NAME=0.0.0.0; anywhere else the page is served to this machine only
    host = os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")
    parser.add_argument("--host", default=host, help="Address to serve on.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("give --model (a folder or Hub id) or set MODEL")
    try:
        demo = build_demo(args.model)
    except (OSError, ValueError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    demo.launch(server_name=args.host, server_port=args.port, theme=THEME)


if __name__ == "__main__":
    main()
