"""Running code in another Python: peak memory, a fresh interpreter offline, packages made missing, writes audited,
the nodes of one distributed run side by side; a free port."""

import inspect
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path


def run_with_peak_rss(command: list[str]) -> tuple[int, str, int]:
    """Run `command`; its exit status, stderr and peak resident memory in bytes (the kernel's count for that one
    child, from wait4)."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        return process.returncode, stderr.read().decode(errors="replace"), usage.ru_maxrss * 1024


PEAK_GROWTH_CODE = """
import re

def resident(field):
    with open("/proc/self/status") as status:
        return int(re.search(field + r":\\s+(\\d+) kB", status.read()).group(1)) * 1024

{setup}
with open("/proc/self/clear_refs", "w") as clear_refs:
    clear_refs.write("5")  # the peak (VmHWM) starts again from here
before = resident("VmRSS")
{measured}
print(resident("VmHWM") - before)
"""


def peak_growth(setup: str, measured: str) -> int:
    """How far, in bytes, running the code `measured` raises the resident memory of a fresh Python, at its peak,
    above where `setup` (run first: imports, a first call that leaves lazy imports done) left it. Linux's
    /proc/self/clear_refs resets the peak: a system without it fails the test, naming what it lacks, rather than
    leaving the memory unchecked."""
    assert os.access("/proc/self/clear_refs", os.W_OK), "measuring a peak needs Linux's /proc/self/clear_refs"
    code = PEAK_GROWTH_CODE.format(setup=textwrap.dedent(setup), measured=textwrap.dedent(measured))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.splitlines()[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_side_by_side(commands: list[list[str]], envs: list[dict], logs: list[Path], timeout: float) -> list[int | None]:
    """Run `commands` at once, each with its environment and its output in its log, as the nodes of one distributed
    run on separate machines; their exit statuses. Once one fails, or at `timeout` seconds, the others are stopped
    (status None), which would otherwise wait for a failed node until their collective timeout: SIGTERM, on which a
    launcher stops the workers it started (torch's elastic agent sends them SIGTERM, then SIGKILL)."""
    processes = []
    try:
        for command, env, log in zip(commands, envs, logs, strict=True):
            with open(log, "w") as stream:
                processes.append(subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = [process.poll() for process in processes]
            if None not in statuses or any(statuses):
                break
            time.sleep(0.5)
    finally:
        statuses = [process.poll() for process in processes]
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return statuses


def run_python(code: str, hf_home, package_importable: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python, offline, with standard input closed (so a prompt cannot wait for an answer)
    and, unless `package_importable`, where `import hf_vanilla_transformer` fails."""
    block = "" if package_importable else 'import sys\nsys.modules["hf_vanilla_transformer"] = None\n'
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", block + textwrap.dedent(code)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# Python's audit hooks see every file a process opens for writing, renames or removes from Python code (transformers'
# JSON files, our atomic writes); `sitecustomize` installs one in each process a launcher starts.
WRITE_AUDIT = """
import os, sys

def _install(log_dir, root):
    log = open(os.path.join(log_dir, f"{os.environ.get('RANK', 'single')}-{os.getpid()}.txt"), "a", buffering=1)
    root = os.path.realpath(root) + os.sep

    def record(what, path):
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(path))
            if path.startswith(root):
                log.write(f"{what} {path[len(root):]}\\n")

    def hook(event, args):
        if event == "open" and (any(c in args[1] for c in "wax+") if args[1] else args[2] & (os.O_WRONLY | os.O_RDWR)):
            record("write", args[0])
        elif event in ("os.rename", "os.replace"):
            record(event, args[1])
        elif event == "os.remove":
            record(event, args[0])

    sys.addaudithook(hook)

if os.environ.get("WRITE_AUDIT_DIR"):
    _install(os.environ["WRITE_AUDIT_DIR"], os.environ["WRITE_AUDIT_ROOT"])
"""


def sitecustomize_env(folder: Path, code: str) -> dict:
    """The environment of a Python process that runs `code` at start-up (a `sitecustomize` module in `folder`)."""
    (folder / "site").mkdir(parents=True)
    (folder / "site" / "sitecustomize.py").write_text(code)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder / "site"), os.environ.get("PYTHONPATH")])),
    }


def write_audit_env(folder: Path, root: Path) -> dict:
    """The environment for a launched command whose writes under `root` are to be recorded in `folder`, one log per
    process named by its RANK ("single" outside a launcher); read them with `audited_writes`."""
    return {**sitecustomize_env(folder, WRITE_AUDIT), "WRITE_AUDIT_DIR": str(folder), "WRITE_AUDIT_ROOT": str(root)}


class NotInstalled:
    """A meta-path finder under which importing one of `packages` fails as it does where the package is not
    installed (first on `sys.meta_path`, and with the package not imported yet)."""

    def __init__(self, *packages: str):
        self.packages = set(packages)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def not_installed_env(folder: Path, *packages: str) -> dict:
    """The environment of a Python process in which `packages` are not installed, as far as imports tell."""
    code = f"import sys\n\n{inspect.getsource(NotInstalled)}\nsys.meta_path.insert(0, NotInstalled(*{packages!r}))\n"
    return sitecustomize_env(folder, code)


def audited_ranks(folder: Path) -> set[str]:
    """The RANKs of the processes `write_audit_env` recorded ("single" outside a launcher, and the launcher itself),
    whether or not they wrote anything."""
    return {log.name.split("-")[0] for log in folder.glob("*-*.txt")}


def audited_writes(folder: Path) -> dict[str, list[str]]:
    """{rank: ["write PATH", "os.replace PATH", ...]} of the processes `write_audit_env` recorded, paths relative
    to the root; the launcher itself, if it wrote nothing there, is left out."""
    writes = {}
    for log in sorted(folder.glob("*-*.txt")):
        lines = log.read_text().splitlines()
        if lines:
            writes.setdefault(log.name.split("-")[0], []).extend(lines)
    return writes
