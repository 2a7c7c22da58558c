#!/usr/bin/env bash
# What the systemd tests need beyond .venv: systemd's tools (systemd-analyze,
# systemd-socket-activate, systemd-nspawn) and a virtualenv on the distribution's
# python3 for the container, since ProtectHome= hides an interpreter under /root
# from the broker there. ppmq is installed into it as a copy, so the venv works
# wherever the checkout is; the test mounts the current src/ppmq over that copy.
# Without root or apt-get the tests that need these skip.
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
command -v systemd-socket-activate >/dev/null || missing+=(systemd)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
if ((${#missing[@]})) && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q "${missing[@]}" || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }
fi

venv=build/system-venv
if [ -x /usr/bin/python3 ] && { [ ! -e "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ]; }; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet .
    touch "$venv/.installed"
fi
