#!/usr/bin/env bash
# Build ppmq's packages into OUTDIR from one tree made by stage.sh:
#   deb  ppmq_VERSION-REVISION_ARCH.deb, packed by nfpm (nfpm.yaml) with the
#        maintainer scripts and docs of deb/; the version comes from deb/changelog
#   rpm  ppmq-VERSION-RELEASE.ARCH.rpm, built by rpmbuild from rpm/ppmq.spec. On
#        Debian this checks the spec; a package for EL is built on EL (see the spec).
#
# Usage: packaging/build.sh OUTDIR FORMAT...
# Environment: NFPM, the nfpm command (default: nfpm on PATH); PPMQ_PYTHON as for
# stage.sh.
set -euo pipefail
umask 022

here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:?usage: $0 OUTDIR FORMAT...}" && cd "$1" && pwd)
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "build.sh: $*" >&2; exit 1; }

build_deb() {
    local nfpm version upstream project_version
    nfpm=$(readlink -f "$(command -v "${NFPM:-nfpm}")") || fail "nfpm not found: run packaging/install-tools.sh"
    version=$(dpkg-parsechangelog -l "$here/deb/changelog" -S Version)
    upstream=${version%-*}
    project_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../pyproject.toml")
    [ "$upstream" = "$project_version" ] ||
        fail "packaging/deb/changelog is at $version but pyproject.toml at $project_version: add a changelog entry"
    mkdir "$work/doc"
    gzip -9n <"$here/deb/changelog" >"$work/doc/changelog.Debian.gz"
    ln -s "$here/deb" "$work/deb"
    # nfpm expands variables in the version and arch fields only: nfpm.yaml names
    # stage/, doc/ and deb/ relative to the directory it runs in.
    (
        export PPMQ_VERSION=$upstream PPMQ_REVISION=${version##*-}
        export PPMQ_ARCH=$(dpkg --print-architecture)
        export PPMQ_PYTHON_VERSION=$("$work/stage/opt/ppmq/bin/python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        export SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -l "$here/deb/changelog" -S Timestamp)
        cd "$work"
        "$nfpm" package --config "$here/nfpm.yaml" --packager deb --target "$out/"
    )
}

build_rpm() {
    rpmbuild --quiet -bb --define "_topdir $work/rpmbuild" --define "stagedir $work/stage" "$here/rpm/ppmq.spec"
    cp "$work"/rpmbuild/RPMS/*/ppmq-*.rpm "$out/"
}

[ $# -gt 0 ] || fail "usage: $0 OUTDIR FORMAT... (deb, rpm)"
for format in "$@"; do
    case $format in
        deb | rpm) ;;
        *) fail "unknown package format '$format': deb or rpm" ;;
    esac
done
"$here/stage.sh" "$work/stage"
for format in "$@"; do
    "build_$format"
done
