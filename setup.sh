#!/usr/bin/env bash
# Set-up, as root on Debian: the system packages the tests use (a real headless browser for the demo page and a
# CJK font for Chinese labels in pictures) where missing, then the package with every extra and the test tools.
set -euo pipefail
cd "$(dirname "$0")"
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
[ -e /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || missing+=(fonts-wqy-microhei)
if ((${#missing[@]})); then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
pip install -e ".[dev]"
