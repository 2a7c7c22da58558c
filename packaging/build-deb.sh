#!/usr/bin/env bash
# Build ppmq_VERSION_ARCH.deb into OUTDIR (default dist/): the tree of stage.sh,
# packed by nfpm (nfpm.yaml) with the maintainer scripts and docs of deb/.
#
# Usage: packaging/build-deb.sh [OUTDIR]
# Environment: NFPM, the nfpm command (default: nfpm on PATH); PPMQ_STAGE, a tree
# made by stage.sh to pack instead of making one; PPMQ_PYTHON as for stage.sh.
set -euo pipefail
umask 022

here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-$here/../dist}" && cd "${1:-$here/../dist}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "build-deb.sh: $*" >&2; exit 1; }
nfpm=$(readlink -f "$(command -v "${NFPM:-nfpm}")") || fail "nfpm not found: run packaging/install-tools.sh"

version=$(dpkg-parsechangelog -l "$here/deb/changelog" -S Version)
upstream=${version%-*}
project_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../pyproject.toml")
[ "$upstream" = "$project_version" ] ||
    fail "packaging/deb/changelog is at $version but pyproject.toml at $project_version: add a changelog entry"

stage=${PPMQ_STAGE:-$work/stage}
[ -n "${PPMQ_STAGE:-}" ] || "$here/stage.sh" "$stage"
[ "$stage" = "$work/stage" ] || ln -s "$(cd "$stage" && pwd)" "$work/stage"
mkdir "$work/doc"
gzip -9n <"$here/deb/changelog" >"$work/doc/changelog.Debian.gz"

ln -s "$here/deb" "$work/deb"
export PPMQ_VERSION=$upstream PPMQ_REVISION=${version##*-}
export PPMQ_ARCH=$(dpkg --print-architecture)
export PPMQ_PYTHON_VERSION=$("$stage/opt/ppmq/bin/python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
export SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -l "$here/deb/changelog" -S Timestamp)
cd "$work"
"$nfpm" package --config "$here/nfpm.yaml" --packager deb --target "$out/"
