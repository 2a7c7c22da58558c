#!/usr/bin/env bash
# Build ppmq-VERSION-RELEASE.ARCH.rpm into OUTDIR (default dist/) with rpmbuild from
# rpm/ppmq.spec and the tree of stage.sh. On Debian this checks the spec; a package
# for EL is built on EL (see the spec's header).
#
# Usage: packaging/build-rpm.sh [OUTDIR]
# Environment: PPMQ_STAGE, a tree made by stage.sh to pack instead of making one;
# PPMQ_PYTHON as for stage.sh.
set -euo pipefail
umask 022

here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-$here/../dist}" && cd "${1:-$here/../dist}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stage=${PPMQ_STAGE:-$work/stage}
[ -n "${PPMQ_STAGE:-}" ] || "$here/stage.sh" "$stage"
rpmbuild --quiet -bb --define "_topdir $work/rpmbuild" --define "stagedir $(cd "$stage" && pwd)" "$here/rpm/ppmq.spec"
cp "$work"/rpmbuild/RPMS/*/ppmq-*.rpm "$out/"
