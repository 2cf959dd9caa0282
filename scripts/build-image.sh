#!/usr/bin/env bash
# Builds NodeKernel's container image from Debian packages only: no base
# image and no registry, only Debian's package mirror (deb.debian.org).
#
#   scripts/build-image.sh [--nk PATH] [--out DIR]
#
#   --nk PATH   the nk binary to put in the image (default: build it with
#               cargo build --release -p nodekernel-cli --locked)
#   --out DIR   where the image goes (default: target/image)
#
# The image is distroless-style: the files of the Debian packages nk needs
# (libc6 and libgcc-s1, which nk links against, and fuse3 for fusermount3,
# so that `nk mount` works in a sidecar), without their documentation,
# locales and gconv modules; /etc/passwd and /etc/group with the user
# nodekernel (uid and gid 10001); /var/lib/nodekernel owned by it; /tmp; and
# nk (without its debug info) at /usr/local/bin/nk, the entry point. One
# image serves every role (nk up, meta, store, mount and the client
# commands); it has no shell. Debian release: bookworm, pinned here (the
# binary must link against a C library no newer than the release's 2.36:
# build it on bookworm).
#
# Output (a stable layout, docs/deployment.md, "Container image"):
#   DIR/oci/                          OCI image layout, ref nodekernel:VERSION
#   DIR/nodekernel-VERSION.oci.tar    the same as an oci-archive (podman load,
#                                     docker load)
#   DIR/nodekernel-VERSION.packages.txt  Debian release, package versions and
#                                     hashes, nk's hash, the image's digest
# VERSION is the workspace version (Cargo.toml). Every file's time is the
# commit's (SOURCE_DATE_EPOCH overrides it), so the same inputs give the same
# layer. Needs root (the rootfs' files belong to root and to uid 10001),
# apt-get and Debian's archive keyring (any Debian host); installs umoci if
# missing. Each step prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
MIRROR=${NK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${NK_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ARCH=amd64
MULTIARCH=x86_64-linux-gnu
# What the image holds: nk's shared libraries (ldd: libc, libm, libgcc_s)
# and fusermount3 (which needs only libc).
PACKAGES=(libc6 libgcc-s1 fuse3)
# base-files gives only /etc/os-release (what scanners read to know the
# distribution) and /etc/debian_version.
UID_NK=10001

nk=
out=target/image
while [[ $# -gt 0 ]]; do
    case $1 in
        --nk) nk=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) echo "build-image: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done

if [[ $(id -u) != 0 ]]; then
    echo "build-image: run as root (the image's files belong to root and to uid $UID_NK)" >&2
    exit 1
fi
if [[ $(dpkg --print-architecture 2>/dev/null || true) != "$ARCH" ]]; then
    echo "build-image: builds the $ARCH image on a Debian $ARCH host (apt-get, dpkg)" >&2
    exit 1
fi
# shellcheck source=scripts/lib/system-deps.sh
source scripts/lib/system-deps.sh
ensure_tools "building the container image" umoci=umoci strip=binutils
[[ -r $KEYRING ]] || DEBIAN_FRONTEND=noninteractive apt-get install -y debian-archive-keyring

VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[[ -n $VERSION ]] || { echo "build-image: no workspace version in Cargo.toml" >&2; exit 1; }
REF=nodekernel:$VERSION
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $COMMIT != unknown ]] && [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    COMMIT=$COMMIT-dirty
fi
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
CREATED=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)

source scripts/lib/steps.sh

WORK=$(mktemp -d /tmp/nk-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/rootfs

build_nk() {
    cargo build --release -p nodekernel-cli --locked
}
if [[ -z $nk ]]; then
    step "cargo build --release -p nodekernel-cli" build_nk
    nk=${CARGO_TARGET_DIR:-target}/release/nk
fi
[[ -x $nk ]] || { echo "build-image: $nk is not an executable" >&2; exit 1; }
nk=$(realpath "$nk")
mkdir -p "$out"
out=$(realpath "$out")

# apt with a configuration, lists and cache of its own: the host's sources
# and state play no part, whatever release the host runs.
APT_OPTS=(
    -o "Dir::Etc::SourceList=$WORK/apt/sources.list"
    -o "Dir::Etc::SourceParts=$WORK/apt/none"
    -o "Dir::Etc::Preferences=$WORK/apt/none"
    -o "Dir::Etc::PreferencesParts=$WORK/apt/none"
    -o "Dir::State=$WORK/apt/state"
    -o "Dir::State::status=$WORK/apt/state/status"
    -o "Dir::Cache=$WORK/apt/cache"
    -o "APT::Architecture=$ARCH"
    -o "APT::Architectures=$ARCH"
    -o "APT::Sandbox::User=root"
    -o "Debug::NoLocking=1"
)
download() {
    mkdir -p "$WORK/apt/state/lists/partial" "$WORK/apt/cache/archives/partial" \
        "$WORK/apt/none" "$WORK/debs"
    : >"$WORK/apt/state/status"
    cat >"$WORK/apt/sources.list" <<EOF
deb [signed-by=$KEYRING] $MIRROR $SUITE main
deb [signed-by=$KEYRING] $MIRROR $SUITE-updates main
deb [signed-by=$KEYRING] $SECURITY_MIRROR $SUITE-security main
EOF
    apt-get "${APT_OPTS[@]}" -q update
    # apt-get download checks each package against the signed indexes.
    (cd "$WORK/debs" && apt-get "${APT_OPTS[@]}" -q download "${PACKAGES[@]}" base-files)
}
step "download the Debian $SUITE packages (${PACKAGES[*]}, base-files)" download

deb_of() { echo "$WORK/debs/$1"_*.deb; }

rootfs() {
    local pkg deb d
    mkdir -p "$ROOTFS"
    # The merged /usr of Debian since bookworm: /bin, /sbin and /lib are
    # links into /usr, which the packages' files land in through them.
    mkdir -p "$ROOTFS"/usr/{bin,sbin,lib,lib64} "$ROOTFS/usr/lib/$MULTIARCH"
    for d in bin sbin lib lib64; do ln -s "usr/$d" "$ROOTFS/$d"; done
    mkdir -p "$ROOTFS/var/lib/dpkg/status.d"
    for pkg in "${PACKAGES[@]}"; do
        deb=$(deb_of "$pkg")
        dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$ROOTFS"
        # What scanners read to list an image's packages (as distroless
        # images do): each package's control fields.
        { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } \
            >"$ROOTFS/var/lib/dpkg/status.d/$pkg"
    done
    # What fuse3's postinst does: fusermount3 is set-uid root, so that a
    # non-root nk mount can mount (where the runtime allows it: /dev/fuse,
    # CAP_SYS_ADMIN in the bounding set, privilege escalation allowed).
    chmod 4755 "$ROOTFS/usr/bin/fusermount3"
    # A sidecar's mount is for other containers' processes, of other users:
    # nk mount --allow-other may say so (the kernel still checks each
    # file's mode, nk mounts with default_permissions).
    sed -i 's/^#user_allow_other/user_allow_other/' "$ROOTFS/etc/fuse.conf"
    grep -q '^user_allow_other' "$ROOTFS/etc/fuse.conf"
    # Only the release's identification from base-files.
    mkdir -p "$WORK/base-files"
    dpkg-deb -x "$(deb_of base-files)" "$WORK/base-files"
    cp "$WORK/base-files/usr/lib/os-release" "$ROOTFS/usr/lib/os-release"
    ln -s ../usr/lib/os-release "$ROOTFS/etc/os-release"
    cp "$WORK/base-files/etc/debian_version" "$ROOTFS/etc/debian_version"
    # Neither nk nor fusermount3 reads documentation, translations or
    # character-set conversion modules (iconv); initramfs hooks are for hosts.
    rm -rf "$ROOTFS"/usr/share/{doc,man,info,locale,lintian,initramfs-tools} \
        "$ROOTFS/usr/lib/$MULTIARCH/gconv"
    rmdir "$ROOTFS/usr/share" 2>/dev/null || true

    cat >"$ROOTFS/etc/passwd" <<EOF
root:x:0:0:root:/root:/usr/sbin/nologin
nodekernel:x:$UID_NK:$UID_NK:NodeKernel:/var/lib/nodekernel:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
    cat >"$ROOTFS/etc/group" <<EOF
root:x:0:
nodekernel:x:$UID_NK:
nogroup:x:65534:
EOF
    chmod 0644 "$ROOTFS/etc/passwd" "$ROOTFS/etc/group"
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"
    # Runtimes usually mount their own /etc/hosts; this one names localhost
    # where they do not (runc).
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"
    # fusermount3 updates /etc/mtab only when it is a file.
    ln -s ../proc/self/mounts "$ROOTFS/etc/mtab"
    mkdir -p "$ROOTFS"/{dev,proc,sys,run,root,usr/local/bin}
    chmod 0700 "$ROOTFS/root"
    install -d -m 1777 "$ROOTFS/tmp"
    install -d -m 0700 -o "$UID_NK" -g "$UID_NK" "$ROOTFS/var/lib/nodekernel"
    # Without the debug info (the release profile keeps line tables: about
    # 5x the size); the symbols stay, for backtraces.
    install -m 0755 "$nk" "$ROOTFS/usr/local/bin/nk"
    strip --strip-debug "$ROOTFS/usr/local/bin/nk"
    # Same inputs, same files: every time is the commit's.
    find "$ROOTFS" -depth -exec touch -h -d "@$EPOCH" {} +
}
step "assemble the root file system" rootfs

smoke() {
    # The binary and fusermount3 run on the image's own C library (a binary
    # linked against a newer one than the release's fails here).
    chroot "$ROOTFS" /usr/local/bin/nk --version
    chroot "$ROOTFS" /usr/bin/fusermount3 --version
    local missing
    missing=$(chroot "$ROOTFS" /lib64/ld-linux-x86-64.so.2 --list /usr/local/bin/nk | grep 'not found' || true)
    [[ -z $missing ]] || { echo "build-image: libraries missing in the image: $missing" >&2; exit 1; }
}
step "run nk and fusermount3 in the root file system (chroot)" smoke

oci() {
    local layout=$WORK/oci args=()
    umoci init --layout "$layout"
    umoci new --image "$layout:$REF"
    umoci insert --image "$layout:$REF" \
        --history.created "$CREATED" --history.created_by "scripts/build-image.sh: Debian $SUITE ${PACKAGES[*]}, nk $VERSION" \
        "$ROOTFS" /
    args=(
        --os linux --architecture "$ARCH" --created "$CREATED" --author NodeKernel
        --config.entrypoint /usr/local/bin/nk --config.cmd=--help
        --config.user "$UID_NK:$UID_NK" --config.workingdir /var/lib/nodekernel
        --config.env PATH=/usr/local/bin:/usr/bin:/bin
        --config.env HOME=/var/lib/nodekernel
        --config.exposedports 9060/tcp --config.exposedports 9070/tcp --config.exposedports 9071/tcp
        --config.stopsignal SIGTERM
        --history.created "$CREATED" --history.created_by "scripts/build-image.sh: entry point nk, user $UID_NK"
    )
    local label
    for label in \
        "org.opencontainers.image.title=nodekernel" \
        "org.opencontainers.image.description=NodeKernel: tiered storage for temporary data (every role: nk up, meta, store, mount, clients)" \
        "org.opencontainers.image.version=$VERSION" \
        "org.opencontainers.image.revision=$COMMIT" \
        "org.opencontainers.image.created=$CREATED" \
        "org.opencontainers.image.licenses=Apache-2.0" \
        "org.opencontainers.image.base.name=debian:$SUITE (packages: ${PACKAGES[*]})"; do
        args+=(--config.label "$label" --manifest.annotation "$label")
    done
    umoci config --image "$layout:$REF" "${args[@]}"
    umoci gc --layout "$layout"
    # docker load names the image from this annotation (as docker save
    # writes it); podman load from the ref name.
    python3 - "$layout/index.json" "docker.io/library/$REF" <<'PY'
import json, sys
path, name = sys.argv[1:]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY
    find "$layout" -depth -exec touch -h -d "@$EPOCH" {} +
    rm -rf "$out/oci" "$out/oci.new"
    cp -a "$layout" "$out/oci.new"
    mv "$out/oci.new" "$out/oci"
    tar --sort=name --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
        -C "$out/oci" -cf "$out/nodekernel-$VERSION.oci.tar.new" .
    mv "$out/nodekernel-$VERSION.oci.tar.new" "$out/nodekernel-$VERSION.oci.tar"
}
step "make the OCI image (umoci) and its archive" oci

manifest() {
    local f=$out/nodekernel-$VERSION.packages.txt pkg deb list
    list=$WORK/apt/state/lists
    {
        echo "# NodeKernel container image $REF, made by scripts/build-image.sh"
        echo "image: $REF"
        echo "manifest digest: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$out/oci/index.json")"
        echo "created: $CREATED"
        echo "revision: $COMMIT"
        echo "nk: /usr/local/bin/nk, $("$ROOTFS/usr/local/bin/nk" --version), sha256 $(sha256sum <"$ROOTFS/usr/local/bin/nk" | cut -d' ' -f1) (from $nk, sha256 $(sha256sum <"$nk" | cut -d' ' -f1), debug info stripped)"
        echo "debian: $SUITE ($(cat "$ROOTFS/etc/debian_version")), $ARCH, from $MIRROR and $SECURITY_MIRROR"
        local r
        for r in "$list"/*_InRelease; do
            echo "  index $(basename "$r"): $(sed -n 's/^Date: //p' "$r" | head -n 1)"
        done
        echo "root file system: $(du -sb "$ROOTFS" | cut -f1) bytes, $(find "$ROOTFS" | wc -l) entries"
        echo "archive: nodekernel-$VERSION.oci.tar, $(stat -c %s "$out/nodekernel-$VERSION.oci.tar") bytes"
        echo "removed from the packages: /usr/share/{doc,man,info,locale,lintian,initramfs-tools}, /usr/lib/$MULTIARCH/gconv"
        echo
        echo "# package version architecture sha256-of-the-.deb"
        for pkg in "${PACKAGES[@]}" base-files; do
            deb=$(deb_of "$pkg")
            printf '%s %s %s %s%s\n' "$pkg" "$(dpkg-deb -f "$deb" Version)" "$(dpkg-deb -f "$deb" Architecture)" \
                "$(sha256sum <"$deb" | cut -d' ' -f1)" \
                "$([[ $pkg == base-files ]] && echo ' (only /usr/lib/os-release, /etc/debian_version)')"
        done
    } >"$f"
    cat "$f"
}
step "record the packages (nodekernel-$VERSION.packages.txt)" manifest

steps_summary "build-image: step times"
echo "image $REF in $out/oci ($(du -sh "$out/oci" | cut -f1)), archive $out/nodekernel-$VERSION.oci.tar"
