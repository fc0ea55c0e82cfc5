"""demo/web/serve.py against hostile requests, over real HTTP on a loopback port: it serves the files the page loads
and nothing else (no listing, not its own source, no symbolic link out of a folder), and a bad request is a 404 or
400 with one log line, never a traceback. The page translating in a browser: system/test_onnx_runtimes.py (slow)."""

import http.client
import importlib.util
import socket
import threading
import time

import pytest

from support.paths import REPO_ROOT

PAGE_FOLDER = REPO_ROOT / "demo" / "web"
SECRET = "a file outside every served folder"
# the files of an export as vanilla-export-onnx writes it, its model card included (the bytes do not matter to the
# server), but tokenizer.json and one graph: links, made by the `export` fixture
EXPORT_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "README.md",
    "onnx/encoder_model.onnx",
    "onnx/decoder_model_merged.onnx",
    "onnx/encoder_model_quantized.onnx",
]


def load_serve():
    """demo/web/serve.py as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location("serve", PAGE_FOLDER / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def outside(tmp_path):
    """A file outside the served folders, for links to point at."""
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.txt"
    secret.write_text(SECRET)
    return secret


@pytest.fixture
def export(tmp_path, outside):
    """A tmp export folder whose onnx/decoder_model_merged_quantized.onnx links to a graph beside it (served) and
    whose tokenizer.json links out of it (refused)."""
    folder = tmp_path / "export"
    (folder / "onnx").mkdir(parents=True)
    for name in EXPORT_FILES:
        (folder / name).write_text(f"the export's {name}")
    (folder / "onnx" / "decoder_model_merged_quantized.onnx").symlink_to("decoder_model_merged.onnx")
    (folder / "tokenizer.json").symlink_to(outside)
    return folder


@pytest.fixture
def serve_page():
    """`serve_page(model_folder, page_folder, **options)`: serve.py's server (`options`: page_server's) on a free
    loopback port, serving in a thread; its port. Every server is shut down when the test ends."""
    serve, servers = load_serve(), []

    def start(model_folder, page_folder=serve.PAGE_FOLDER, **options) -> int:
        server = serve.page_server(str(model_folder), 0, str(page_folder), **options)
        servers.append(server)
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, for each of the tests
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server.server_port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(port: int, target: str, method: str = "GET") -> tuple[int, bytes]:
    """`method` `target` (sent as written: http.client neither normalizes nor quotes it); the status and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, target)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_the_page_and_the_export_files_it_loads_are_served(serve_page, export):
    port = serve_page(export)
    assert get(port, "/") == (200, (PAGE_FOLDER / "index.html").read_bytes())
    assert get(port, "/index.html") == get(port, "/?model=model&dtype=q8") == get(port, "/")
    assert get(port, "/page.js") == (200, (PAGE_FOLDER / "page.js").read_bytes())
    for name in [
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "onnx/encoder_model.onnx",
        "onnx/decoder_model_merged.onnx",
        "onnx/encoder_model_quantized.onnx",
    ]:
        assert get(port, f"/models/model/{name}") == (200, (export / name).read_bytes()), name
    # a link that stays inside the export is followed
    assert get(port, "/models/model/onnx/decoder_model_merged_quantized.onnx") == (
        200,
        (export / "onnx" / "decoder_model_merged.onnx").read_bytes(),
    )


@pytest.mark.parametrize(
    "target",
    [
        # files of the page's folder that the page does not load, this script's source among them
        "/serve.py",
        "/package.json",
        "/package-lock.json",
        "/translate.mjs",
        # folders: no listing
        "/node_modules/",
        "/node_modules",
        "/models/",
        "/models/model/",
        "/models/model/onnx/",
        # in the export, not loaded by the page; a link out of the export
        "/models/model/README.md",
        "/models/model/tokenizer.json",
        # paths that climb out, or name a file with more after it
        "/models/model/../../serve.py",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/models/model/..%2f..%2fserve.py",
        "//etc/passwd",
        "/page.js/",
        "/models/model/config.json/",
        "/%70age.js%00",
        "/models/model/config.json%00",
    ],
)
def test_nothing_else_is_served(serve_page, export, target):
    port = serve_page(export)
    status, body = get(port, target)
    assert status == 404, body[:200]
    assert SECRET.encode() not in body and b"<title>Directory listing" not in body


def test_a_library_file_is_served_only_when_the_page_loads_it_and_it_lies_in_node_modules(
    serve_page, export, outside, tmp_path
):
    """On a page folder of its own, whose node_modules holds the files the page loads, others, and a link out."""
    page = tmp_path / "page"
    library = {
        "@huggingface/transformers/dist/transformers.js": 200,  # what page.js imports
        "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm": 200,  # ONNX Runtime, as Chromium loads it
        "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.mjs": 200,
        "@huggingface/transformers/dist/transformers.min.js": 404,  # there, but not loaded
        "@huggingface/transformers/package.json": 404,
        "onnxruntime-web/dist/ort.all.js": 404,
    }
    for name in library:
        (page / "node_modules" / name).parent.mkdir(parents=True, exist_ok=True)
        (page / "node_modules" / name).write_text(name)
    (page / "page.js").write_text("page.js")
    # a file the page loads, linked out of node_modules
    (page / "node_modules" / "onnxruntime-web" / "dist" / "ort-wasm-simd-threaded.jsep.wasm").symlink_to(outside)
    library["onnxruntime-web/dist/ort-wasm-simd-threaded.jsep.wasm"] = 404
    port = serve_page(export, page)
    served = {name: get(port, f"/node_modules/{name}") for name in library}
    assert {name: status for name, (status, _) in served.items()} == library
    assert all(body == name.encode() for name, (status, body) in served.items() if status == 200)
    assert get(port, "/page.js") == (200, b"page.js")


def test_a_bad_request_is_a_4xx_and_one_log_line(serve_page, export, capsys):
    """`%00` made SimpleHTTPRequestHandler open a path with a NUL in it: a ValueError and its traceback. Each bad
    request here gets its status and one line (the request, its status), on stderr as http.server logs."""
    port = serve_page(export)
    capsys.readouterr()
    requests = {
        ("GET", "/%00"): 404,
        ("GET", "/models/model/%00"): 404,
        ("GET", "/../serve.py"): 404,
        ("HEAD", "/serve.py"): 404,
        ("POST", "/page.js"): 501,
        ("GET", "no-slash"): 404,
    }
    for (method, target), expected in requests.items():
        assert get(port, target, method)[0] == expected, (method, target)
    raw = {
        b"GET /a b HTTP/1.1\r\n\r\n": (400, '"GET /a b HTTP/1.1" 400'),  # sent as no client would
        b"GET /\x00 HTTP/1.1\r\n\r\n": (404, '"GET /\\x00 HTTP/1.1" 404'),
    }
    for request, (expected, _) in raw.items():
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(request)
            assert connection.makefile("rb").readline().split()[1] == str(expected).encode(), request
    # each line is written once its response is sent: the client may have read it first
    lines = logged_until(capsys, lambda text: len(text.splitlines()) >= len(requests) + len(raw))
    assert "Traceback (most recent call last):" not in lines
    assert len(lines) == len(requests) + len(raw), lines
    logged = [f'"{method} {target} HTTP/1.1" {status}' for (method, target), status in requests.items()]
    # each request its own line; in any order, as each is written by its connection's thread after its response
    for expected in logged + [line for _, line in raw.values()]:
        assert sum(expected in line for line in lines) == 1, (expected, lines)


def logged_until(capsys, done, timeout: float = 60) -> list[str]:
    """The lines logged (stderr) from now until `done(text so far)` holds, or `timeout` seconds have passed (a bound
    on a hang, not a measure of speed)."""
    text, deadline = "", time.monotonic() + timeout
    while not done(text) and time.monotonic() < deadline:
        time.sleep(0.05)
        text += capsys.readouterr().err
    return text.splitlines()


def test_a_client_that_hangs_up_mid_response_is_one_log_line(serve_page, export, capsys):
    """A client asks for a graph and closes before reading it: writing the rest fails (a reset or a broken pipe),
    which was a 27-line traceback. It is the request's one line, saying that the client hung up."""
    graph = export / "onnx" / "encoder_model.onnx"
    graph.write_bytes(b"0" * 2**25)  # far more than the sockets' buffers hold: the server is still writing
    port = serve_page(export)
    capsys.readouterr()
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.settimeout(30)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /models/model/onnx/encoder_model.onnx HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert client.recv(16).startswith(b"HTTP/1.0 200")  # the response has begun; the rest is left unread
    # socketserver writes an error's traceback between two lines of dashes
    lines = logged_until(capsys, lambda text: "hung up" in text or text.count("-" * 40) == 2)
    assert not any("Traceback" in line for line in lines), lines
    (line,) = lines
    assert '"GET /models/model/onnx/encoder_model.onnx HTTP/1.1" 200' in line and "the client hung up" in line


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /page.js", b"GET /page.js HTTP/1.1\r\nHost: localhost\r\n"],
    ids=["nothing", "half a request line", "headers without their end"],
)
def test_an_idle_connection_is_closed_after_the_timeout(serve_page, export, capsys, sent):
    """A client that connects and sends nothing, or part of a request, held one of the server's threads for as long
    as it liked. The server closes it once `timeout` seconds pass without a byte, with one log line."""
    port = serve_page(export, timeout=0.5)
    capsys.readouterr()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(sent)
        assert client.recv(1024) == b""  # closed by the server, long before the client's own 30 s
    lines = logged_until(capsys, lambda text: "timed out" in text)
    assert len(lines) == 1 and "Request timed out" in lines[0], lines
    assert get(port, "/page.js")[0] == 200  # a request sent at once is served as before
