#!/usr/bin/env bash
# System packages gskit's tests use: Graphviz (pictures in report.html) and Chromium (checks the report
# in a real headless browser). Debian/Ubuntu; run as root.
set -euo pipefail
missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
