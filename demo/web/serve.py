"""Serve the translation page on this machine: the page, transformers.js from node_modules/ (`npm ci
--ignore-scripts` here; setup.sh does it) and one ONNX export (vanilla-export-onnx) as models/model/.

    python demo/web/serve.py --model runs/multi30k-small-onnx      # then open http://127.0.0.1:8000/

The standard library's http.server, bound to 127.0.0.1: a page to look at, not a server to deploy.
"""

import argparse
import contextlib
import functools
import os
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

PAGE_FOLDER = os.path.dirname(os.path.abspath(__file__))
MODEL_URL = "/models/model/"


class PageHandler(SimpleHTTPRequestHandler):
    """Files of the page's folder, and under /models/model/ those of the export."""

    def __init__(self, *args, model_folder: str, **kwargs):
        self.model_folder = model_folder
        super().__init__(*args, directory=PAGE_FOLDER, **kwargs)

    def translate_path(self, path: str) -> str:
        if path.startswith(MODEL_URL):
            relative = super().translate_path("/" + path[len(MODEL_URL) :])
            return os.path.join(self.model_folder, os.path.relpath(relative, PAGE_FOLDER))
        return super().translate_path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A folder written by vanilla-export-onnx.")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "onnx", "decoder_model_merged.onnx")):
        parser.error(f"{args.model}: not an ONNX export (no onnx/decoder_model_merged.onnx); see vanilla-export-onnx")
    if not os.path.isdir(os.path.join(PAGE_FOLDER, "node_modules", "@huggingface", "transformers")):
        parser.error(f"{PAGE_FOLDER}/node_modules has no transformers.js: run npm ci --ignore-scripts there")
    handler = functools.partial(PageHandler, model_folder=os.path.abspath(args.model))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"Serving the translation page at http://127.0.0.1:{args.port}/ (Ctrl-C stops)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
