#!/usr/bin/env bash
# Lay out the installed tree of ppmq under STAGE, as the .deb and the .rpm install it:
#   /opt/ppmq                 private venv on the distribution's python3 (msgspec and
#                             friends are not all packaged by the distributions)
#   /usr/bin/ppmq             symlink into the venv
#   /usr/lib/systemd/system   the units of systemd/, unchanged
#   /usr/lib/sysusers.d, /usr/lib/tmpfiles.d
#   /etc/ppmq/ppmq.yaml       packaging/ppmq.yaml: the service's paths, no subscribers
#   /etc/ppmq/subscribers     empty: the handlers ppmq-subscriber@.service runs
#   /usr/share/man            ppmq(1) and ppmq.yaml(5), made from the parser and the config
#   /usr/share/bash-completion/completions/ppmq, /usr/share/zsh/vendor-completions/_ppmq
#                             completion for bash and zsh, made from the parser
#   /usr/share/doc/ppmq       README.md, which the units name as their documentation,
#                             docs/*.md, which it links to,
#                             copyright, with the bundled packages' licenses, and
#                             examples/subscriber and examples/parallel, whose
#                             ppmq.yaml go into /etc/ppmq/ppmq.yaml
#
# Usage: packaging/stage.sh STAGE
# Environment: PPMQ_PYTHON, the interpreter the venv is built on (default: what
# /usr/bin/python3 points to, resolved to its versioned name so that a later change of
# the default python3 cannot swap the interpreter under the compiled extensions).
set -euo pipefail
umask 022
# The venv holds what the wheel and its dependencies install, nothing of the caller's:
# with a PYTHONPATH naming a source tree (its ppmq.egg-info), pip would count ppmq as
# installed already and leave it out of the venv.
unset PYTHONPATH PYTHONHOME PYTHONUSERBASE

stage=${1:?usage: $0 STAGE}
src=$(cd "$(dirname "$0")/.." && pwd)
python=$(readlink -f "${PPMQ_PYTHON:-/usr/bin/python3}")
venv=$stage/opt/ppmq

fail() { echo "stage.sh: $*" >&2; exit 1; }

# Build ppmq's wheel, then install it with its dependencies into a venv at its final
# path inside STAGE, with the bridge extra so that ppmq-bridge@.service runs; pip is
# removed afterwards since nothing installs into it later.
build_venv() {
    local wheels=$stage.wheels
    "$python" -m venv "$venv"
    "$venv/bin/pip" --quiet --disable-pip-version-check wheel --no-deps -w "$wheels" "$src"
    "$venv/bin/pip" --quiet --disable-pip-version-check install --no-compile "$(echo "$wheels"/ppmq-*.whl)[bridge]"
    "$venv/bin/pip" --quiet --disable-pip-version-check uninstall -y pip setuptools
    rm -rf "$wheels" "$venv"/bin/activate* "$venv"/bin/Activate.ps1 "$venv/include"
    # PEP 610 record of the wheel's build-time location: meaningless once installed.
    rm -f "$venv"/lib/python3*/site-packages/ppmq-*.dist-info/direct_url.json
    # As dh_strip does: no symbol tables or build notes in the shipped extensions.
    find "$venv" -name '*.so' -exec strip --remove-section=.comment --remove-section=.note --strip-unneeded {} +
    # As dh_python3 does: a library module is imported, never run, so a shebang on
    # one (prometheus_client has a few) only names an interpreter nobody uses.
    find "$venv/lib" -name '*.py' ! -perm -u+x -exec sed -i '1{/^#!/d}' {} +
}

# Rewrite the build paths in script shebangs and pyvenv.cfg to the installed ones.
relocate() {
    grep -rlI --null -F "$stage" "$venv" | xargs -0 -r sed -i "s|$stage/opt/ppmq|/opt/ppmq|g"
    if grep -rlI -e "$stage" -e "$src" "$venv"; then
        fail "build paths left in the files above"
    fi
}

# Compile every module now, naming its installed path: ProtectSystem=strict keeps
# /opt read-only at run time, so Python could never write its cache there itself.
# checked-hash: an edited .py is still picked up, whatever the file times say.
compile() {
    "$python" -m compileall -q -s "$stage" -p / --invalidation-mode checked-hash "$venv/lib"
}

# /etc/ppmq/ppmq.yaml: packaging/ppmq.yaml, the sockets and the directory of the units
# with no subscribers or topics, since a real host has none of the examples' handlers.
production_config() {
    install -D -m 0644 "$src/packaging/ppmq.yaml" "$stage/etc/ppmq/ppmq.yaml"
}

system_files() {
    install -D -m 0644 -t "$stage/usr/lib/systemd/system" "$src"/systemd/*.service "$src"/systemd/*.socket
    install -D -m 0644 "$src/systemd/sysusers.d/ppmq.conf" "$stage/usr/lib/sysusers.d/ppmq.conf"
    install -D -m 0644 "$src/systemd/tmpfiles.d/ppmq.conf" "$stage/usr/lib/tmpfiles.d/ppmq.conf"
    install -d -m 0755 "$stage/etc/ppmq/subscribers"
    install -D -m 0644 -t "$stage/usr/share/doc/ppmq" "$src/README.md" "$src/packaging/copyright"
    install -D -m 0644 -t "$stage/usr/share/doc/ppmq/docs" "$src"/docs/*.md
    mkdir "$stage/usr/share/doc/ppmq/examples"
    cp -r "$src/examples/subscriber" "$src/examples/parallel" "$stage/usr/share/doc/ppmq/examples/"
    find "$stage/usr/share/doc/ppmq/examples" -type f -exec chmod 0644 {} +
    mkdir -p "$stage/usr/bin"
    ln -s /opt/ppmq/bin/ppmq "$stage/usr/bin/ppmq"
}

# ppmq(1) and ppmq.yaml(5), made by the staged ppmq from its own parser and config
# Structs (-B: no bytecode written into the stage after compile).
manual_pages() {
    "$venv/bin/python" -B -m ppmq.cli.manpages "$stage/usr/share/man" --example "$src/ppmq.example.yaml" >/dev/null
}

# Completion for bash and zsh, made by the staged ppmq from its own parser, so that
# every command and option of this version completes.
completions() {
    "$venv/bin/python" -B -m ppmq.cli.completion --install "$stage" >/dev/null
}

rm -rf "$stage" "$stage.wheels"
build_venv
relocate
compile
production_config
system_files
manual_pages
completions
