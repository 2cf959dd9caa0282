#!/usr/bin/env bash
# Builds the `nodekernel` Python distributions that carry everything a
# Python user needs:
#   - the binary wheel: the extension module, the Python package (fsspec
#     filesystem, asyncio client, type stubs) and the release `nk` binary as
#     a script (nodekernel-VERSION.data/scripts/nk: `pip install` puts it in
#     the environment's bin/, as ruff's and maturin's wheels do);
#   - the sdist (maturin sdist): the sources of the extension module and the
#     Python package; a wheel built from it has no `nk` (docs/python.md).
#
#   scripts/build-wheel.sh [--nk PATH] [--out DIR]
#
# --nk PATH  reuse an `nk` already built (it must be a release build of
#            this checkout); default: cargo build --release -p nodekernel-cli
# --out DIR  where the wheel and the sdist go; default: the target
#            directory's wheels/ (target/wheels, or $CARGO_TARGET_DIR/wheels),
#            where `maturin build` puts them too
#
# Needs cargo and maturin (the version crates/py/requirements-dev.txt pins:
# on PATH, or $MATURIN, or .venv's from scripts/python-env.sh). Prints each
# step's time. scripts/test-wheel.sh installs the wheel in a fresh virtualenv
# and checks it.
#
# The wheel's platform tag is the one maturin's audit gives the extension
# module (no --compatibility: maturin reads the glibc symbol versions the
# module needs and picks the oldest manylinux policy that allows them, and
# fails on a library that policy does not allow). On Debian 12 (glibc
# 2.36) with a plain cargo toolchain that is manylinux_2_34: since glibc
# 2.34 folded libpthread and libdl into libc, their functions (pthread_*,
# dlsym, ...) carry the version GLIBC_2.34, and a program linked against a
# newer glibc needs at least that. An older tag needs an older glibc to link
# against: maturin's manylinux container (ghcr.io/pyo3/maturin) or
# `maturin build --zig --compatibility manylinux2014`, neither of which
# this machine has. maturin audits only what it builds, so this script
# checks `nk` against the same tag itself (its glibc versions and its
# libraries) and refuses a wheel whose `nk` would not run where the wheel
# installs.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD

NK=
OUT=
while [[ $# -gt 0 ]]; do
    case $1 in
        --nk) NK=${2:?--nk needs a path}; shift 2 ;;
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "build-wheel: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done

die() { echo "build-wheel: $*" >&2; exit 1; }
# Paths given on the command line are the caller's.
if [[ -n $NK && $NK != /* ]]; then NK=$CALLER/$NK; fi
if [[ -n $OUT && $OUT != /* ]]; then OUT=$CALLER/$OUT; fi

command -v cargo >/dev/null 2>&1 || die "cargo not found; install Rust (https://rustup.rs)"
if [[ -z ${MATURIN:-} ]]; then
    MATURIN=$(command -v maturin || true)
    if [[ -z $MATURIN && -x .venv/bin/maturin ]]; then MATURIN=$PWD/.venv/bin/maturin; fi
fi
[[ -n $MATURIN ]] ||
    die "maturin not found: pip install $(grep '^maturin==' crates/py/requirements-dev.txt), or set MATURIN"
for tool in readelf strip; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (binutils)"
done

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
export CARGO_TARGET_DIR=$TARGET # absolute: maturin runs cargo in crates/py
OUT=${OUT:-$TARGET/wheels}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[[ -n $VERSION ]] || die "no version in Cargo.toml's [workspace.package]"

# maturin takes the wheel's data from crates/py/nodekernel._native.data
# when that folder exists (<module-name>.data; see pyproject.toml). It
# lives only while this script runs: gitignored, so the sdist never
# carries it, and removed on exit, so that `maturin develop` and
# scripts/python-env.sh never install a stale nk.
DATA=$ROOT/crates/py/nodekernel._native.data
STAGE=$(mktemp -d)
cleanup() { rm -rf "$DATA" "$STAGE"; }
trap cleanup EXIT

source scripts/lib/steps.sh

build_nk() {
    if [[ -n $NK ]]; then
        [[ -f $NK && -x $NK ]] || die "--nk $NK is not an executable"
        echo "reusing $NK (not rebuilt)"
    else
        nice cargo build --release --locked -p nodekernel-cli
        NK=$TARGET/release/nk
    fi
    local v
    v=$("$NK" --version) || die "$NK --version failed"
    [[ $v == *" $VERSION" ]] || die "$NK is version '$v', this checkout is $VERSION"
    echo "$v"
}

# The highest GLIBC_x.y symbol version FILE needs, and its NEEDED libraries.
glibc_needed() {
    readelf --version-info --wide "$1" |
        grep -o 'Name: GLIBC_[0-9.]*' | sed 's/Name: GLIBC_//' | sort -V | tail -n 1
}
needed_libs() { readelf --dynamic --wide "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

sdist() {
    # Before nk is staged: the sdist takes what git tracks (and nothing
    # gitignored), so it could not carry nk anyway; this makes sure.
    rm -rf "$DATA"
    (cd crates/py && "$MATURIN" sdist --out "$STAGE/sdist")
    SDIST=$STAGE/sdist/nodekernel-$VERSION.tar.gz
    [[ -f $SDIST ]] || die "maturin sdist wrote no nodekernel-$VERSION.tar.gz"
    if tar -tzf "$SDIST" | grep -E '(\.data/|/nk$)'; then
        die "the sdist carries a binary (above)"
    fi
}

stage_nk() {
    mkdir -p "$DATA/scripts"
    # The release profile keeps line tables (debug = 1) for backtraces in
    # the build tree; the wheel's copy goes without them (symbols stay, so
    # a panic's backtrace still names functions).
    strip --strip-debug -o "$DATA/scripts/nk" "$NK"
    chmod 755 "$DATA/scripts/nk"
    ls -l "$NK" "$DATA/scripts/nk"
}

wheel() {
    (cd crates/py && nice "$MATURIN" build --release --locked --strip --out "$STAGE/wheel")
    WHEEL=$(echo "$STAGE"/wheel/nodekernel-"$VERSION"-*.whl)
    [[ -f $WHEEL ]] || die "maturin build wrote no nodekernel-$VERSION wheel"
}

# The wheel holds the module, the package and nk (executable), and nk runs
# wherever the wheel's tag says the wheel installs.
check_wheel() {
    local name tag glibc_tag nk_glibc lib
    name=$(basename "$WHEEL" .whl)
    tag=${name##*-}
    echo "wheel: $(basename "$WHEEL") (platform tag $tag)"
    python3 - "$WHEEL" "$VERSION" <<'PY'
import sys
import zipfile

wheel, version = sys.argv[1:]
entries = {i.filename: i for i in zipfile.ZipFile(wheel).infolist()}
nk = entries.get(f"nodekernel-{version}.data/scripts/nk")
if nk is None:
    sys.exit(f"build-wheel: {wheel} has no nodekernel-{version}.data/scripts/nk")
if not (nk.external_attr >> 16) & 0o111:
    sys.exit(f"build-wheel: nk in {wheel} is not executable")
for want in ("nodekernel/_native.abi3.so", "nodekernel/_native.pyi", "nodekernel/py.typed"):
    if want not in entries:
        sys.exit(f"build-wheel: {wheel} has no {want}")
for name, info in sorted(entries.items()):
    print(f"  {info.file_size:>12,}  {name}")
PY
    if [[ $tag =~ ^manylinux_([0-9]+)_([0-9]+)_ ]]; then
        glibc_tag=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
    elif [[ $tag == manylinux2014_* ]]; then
        glibc_tag=2.17
    else
        die "unexpected platform tag $tag (expected manylinux)"
    fi
    nk_glibc=$(glibc_needed "$DATA/scripts/nk")
    echo "nk needs glibc $nk_glibc; the tag allows up to $glibc_tag"
    [[ $(printf '%s\n%s\n' "$nk_glibc" "$glibc_tag" | sort -V | tail -n 1) == "$glibc_tag" ]] ||
        die "nk needs glibc $nk_glibc, newer than the wheel's tag $tag allows"
    # The libraries every manylinux policy lets a binary take from the system.
    while read -r lib; do
        case $lib in
            libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|librt.so.1|libgcc_s.so.1|ld-linux-x86-64.so.2|ld-linux-aarch64.so.1) ;;
            *) die "nk links $lib, which no manylinux system is sure to have" ;;
        esac
    done < <(needed_libs "$DATA/scripts/nk")
    echo "nk links only: $(needed_libs "$DATA/scripts/nk" | tr '\n' ' ')"
}

publish() {
    rm -f "$OUT"/nodekernel-"$VERSION"-*.whl "$OUT"/nodekernel-"$VERSION".tar.gz
    mv "$WHEEL" "$SDIST" "$OUT"/
    WHEEL=$OUT/$(basename "$WHEEL")
    SDIST=$OUT/$(basename "$SDIST")
}

step "nk (release)" build_nk
step "sdist (maturin sdist)" sdist
step "stage nk into the wheel's data (stripped of debug info)" stage_nk
step "wheel (maturin build --release)" wheel
step "check the wheel: contents, nk against its tag" check_wheel
publish

steps_summary "build-wheel: step times"
echo
ls -l "$WHEEL" "$SDIST"
echo "install: python3 -m pip install $WHEEL"
echo "check:   scripts/test-wheel.sh $WHEEL"
