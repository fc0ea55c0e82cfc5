"""Serve the translation page on this machine: the page, transformers.js from node_modules/ (`npm ci
--ignore-scripts` here; setup.sh does it) and one ONNX export (vanilla-export-onnx) as models/model/.

    python demo/web/serve.py --model runs/multi30k-small-onnx      # then open http://127.0.0.1:8000/

The standard library's http.server, bound to 127.0.0.1: a page to look at, not a server to deploy. It serves only
the files the page loads (PAGE_FILES, LIBRARY_FILES, MODEL_FILES), each only where it lies inside its folder once
symbolic links are followed; anything else, a folder included, is a 404, and every request one log line, a client
that hangs up included. A connection that sends nothing for IDLE_TIMEOUT seconds is closed.
"""

import argparse
import contextlib
import functools
import os
import urllib.parse
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from hf_vanilla_transformer.formats import (
    CONFIG_NAME,
    DECODER_GRAPH,
    ENCODER_GRAPH,
    GENERATION_CONFIG_NAME,
    ONNX_FOLDER,
    QUANTIZED,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    is_onnx_folder,
)

PAGE_FOLDER = os.path.dirname(os.path.abspath(__file__))
# seconds a connection may wait for its client's next byte, or for its client to take more of a response: each holds
# a thread, and a browser opens a new connection when it needs one
IDLE_TIMEOUT = 30.0
MODEL_URL = "/models/model/"
LIBRARY_URL = "/node_modules/"
# URL -> file of the page's folder
PAGE_FILES = {"/": "index.html", "/index.html": "index.html", "/page.js": "page.js"}
# under node_modules/: the library page.js imports, and ONNX Runtime's WebAssembly builds, of which it loads the one
# the browser's features call for (headless Chromium: asyncify)
LIBRARY_FILES = frozenset(
    [
        "@huggingface/transformers/dist/transformers.js",
        *(
            f"onnxruntime-web/dist/ort-wasm-simd-threaded{build}.{kind}"
            for build in ("", ".asyncify", ".jsep", ".jspi")
            for kind in ("mjs", "wasm")
        ),
    ]
)
# what transformers.js reads of an export (vanilla-export-onnx's layout): ?dtype=q8 loads the _quantized graphs
MODEL_FILES = frozenset(
    [
        CONFIG_NAME,
        GENERATION_CONFIG_NAME,
        TOKENIZER_FILE,
        TOKENIZER_CONFIG_FILE,
        *(
            f"{ONNX_FOLDER}/{graph}{dtype}.onnx"
            for graph in (ENCODER_GRAPH, DECODER_GRAPH)
            for dtype in ("", QUANTIZED)
        ),
    ]
)


def file_inside(folder: str, relative: str) -> str | None:
    """`folder`/`relative` with its symbolic links resolved, if that is a file inside `folder` (itself resolved);
    else None: a link out of the folder serves nothing."""
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, relative))
    return path if os.path.commonpath([root, path]) == root and os.path.isfile(path) else None


class PageHandler(SimpleHTTPRequestHandler):
    """The page's files, the library's under /node_modules/ and the export's under /models/model/: those the page
    loads, and nothing else (no listing, no other file of these folders, this script included)."""

    def __init__(
        self, *args, model_folder: str, page_folder: str = PAGE_FOLDER, timeout: float = IDLE_TIMEOUT, **kwargs
    ):
        self.model_folder = model_folder
        self.page_folder = page_folder
        self.timeout = timeout  # StreamRequestHandler.setup gives it to the connection
        super().__init__(*args, directory=page_folder, **kwargs)

    def served_file(self, url: str) -> str | None:
        """The file `url` names (its path, %-decoded, as sent: no `..` or `//` is undone), if it is one the page
        loads and lies inside its folder."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        if path in PAGE_FILES:
            return file_inside(self.page_folder, PAGE_FILES[path])
        if path.startswith(LIBRARY_URL) and path.removeprefix(LIBRARY_URL) in LIBRARY_FILES:
            return file_inside(os.path.join(self.page_folder, "node_modules"), path.removeprefix(LIBRARY_URL))
        if path.startswith(MODEL_URL) and path.removeprefix(MODEL_URL) in MODEL_FILES:
            return file_inside(self.model_folder, path.removeprefix(MODEL_URL))
        return None

    def translate_path(self, path: str) -> str:
        # SimpleHTTPRequestHandler.send_head opens what this returns: a file the page loads, else "", which opens
        # nothing (a 404) and is no folder to list
        return self.served_file(path) or ""

    def handle_one_request(self):
        """One request, and its one log line once its response is sent: a client that hung up (a reset, a broken
        pipe) ends the connection with that line saying so, not with a traceback."""
        self.response_code = None
        try:
            super().handle_one_request()
            hung_up = ""
        except ConnectionError as error:
            self.close_connection = True
            hung_up = f"the client hung up ({error.strerror})"
        if self.response_code is not None:
            self.log_message('"%s" %s -%s', self.requestline, self.response_code, f", {hung_up}" if hung_up else "")
        elif hung_up:
            self.log_message("%s", hung_up)

    def log_request(self, code="-", size="-"):
        # send_response's line waits for handle_one_request, which knows whether the client took the response
        self.response_code = code.value if isinstance(code, HTTPStatus) else code

    def log_error(self, format, *args):
        # send_error logs "code 404, message ..." before the request's own line, which has the code: one is enough
        if not format.startswith("code %d"):
            super().log_error(format, *args)


def page_server(
    model_folder: str, port: int, page_folder: str = PAGE_FOLDER, timeout: float = IDLE_TIMEOUT
) -> ThreadingHTTPServer:
    """A server of the page in `page_folder` and the export in `model_folder` on 127.0.0.1:`port` (0: a free one),
    closing a connection idle for `timeout` seconds; not yet serving."""
    handler = functools.partial(
        PageHandler,
        model_folder=os.path.abspath(model_folder),
        page_folder=os.path.abspath(page_folder),
        timeout=timeout,
    )
    return ThreadingHTTPServer(("127.0.0.1", port), handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A folder written by vanilla-export-onnx.")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if not is_onnx_folder(args.model):
        parser.error(
            f"{args.model}: not an ONNX export (no {ONNX_FOLDER}/{DECODER_GRAPH}.onnx); see vanilla-export-onnx"
        )
    if not os.path.isdir(os.path.join(PAGE_FOLDER, "node_modules", "@huggingface", "transformers")):
        parser.error(f"{PAGE_FOLDER}/node_modules has no transformers.js: run npm ci --ignore-scripts there")
    server = page_server(args.model, args.port)
    print(f"Serving the translation page at http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
