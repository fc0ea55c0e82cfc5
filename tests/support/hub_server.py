"""A Hugging Face Hub of one repository, served over HTTP on this machine: what huggingface_hub's downloads ask
(`HF_ENDPOINT` pointed at it in a process of its own), answered from a dict of files, and every request recorded."""

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

COMMIT = "1" * 40


@contextmanager
def served_hub(repo_id: str, files: dict[str, bytes]) -> Iterator[tuple[str, list[str]]]:
    """(the endpoint's URL, the paths requested so far) of a Hub whose only repository `repo_id` holds `files`."""
    requested = []

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = urlparse(self.path).path
            requested.append(path)
            if path == f"/api/models/{repo_id}/revision/main":
                info = {"id": repo_id, "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}
                return self.reply(json.dumps(info).encode())
            if path == f"/api/models/{repo_id}/tree/{COMMIT}":
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()
                ]
                return self.reply(json.dumps(tree).encode())
            name = path.removeprefix(f"/{repo_id}/resolve/{COMMIT}/")
            if name in files:
                etag = f'"{hashlib.sha1(files[name]).hexdigest()}"'
                return self.reply(files[name], [("X-Repo-Commit", COMMIT), ("ETag", etag)])
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def reply(self, body: bytes, headers=()):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            for header in headers:
                self.send_header(*header)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", requested
    finally:
        server.shutdown()
        server.server_close()
