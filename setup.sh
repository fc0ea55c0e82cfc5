#!/usr/bin/env bash
# Set-up: torch (the CPU build 2.13.0, only where no torch is installed: an installed torch, CUDA builds included,
# is kept), then the package with every extra and the test tools. As root on Debian it also installs what only the
# slow test tier uses where missing: a headless browser for the demo pages and a CJK font for Chinese labels.
set -euo pipefail
cd "$(dirname "$0")"
python -c "import torch" 2>/dev/null || pip install torch==2.13.0
pip install -e ".[dev]"
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
[ -e /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || missing+=(fonts-wqy-microhei)
# transformers.js for the ONNX export's browser page and its Node check (slow tier): the versions in the lock file,
# from the npm registry, with no install scripts (onnxruntime-node's would download binaries from elsewhere)
if command -v npm >/dev/null; then
    npm ci --ignore-scripts --no-audit --no-fund --prefix demo/web
else
    echo "setup.sh: the slow test tier also needs Node.js 20 and npm (transformers.js); the quick tier does not" >&2
fi
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "setup.sh: the slow test tier also needs ${missing[*]} (Debian packages); the quick tier does not" >&2
    fi
fi
