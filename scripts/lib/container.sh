# shellcheck shell=bash
# Running NodeKernel's container image (scripts/build-image.sh) with runc,
# without podman or docker: on this project's machines podman's runtimes
# cannot set the resource limits podman always puts in a container's spec
# (crun and runc fail on setrlimit), while runc runs a bundle without them.
# Source it; needs umoci and python3 (scripts/test-image.sh installs umoci
# and runc). docs/deployment.md, "Container image".
#
# nk_bundle IMAGE_DIR BUNDLE_DIR [OPTIONS] [-- ARGS...]
#   Unpacks the image into an OCI runtime bundle (umoci unpack: BUNDLE_DIR
#   must not exist) and patches its config.json for this kind of machine:
#   no rlimits (the container keeps runc's own, i.e. the caller's), no
#   terminal (stdio are the caller's: `runc run -d ... >log` works), the
#   image's user (10001:10001) and entry point kept, a read-only root with a
#   tmpfs /tmp, and /var/lib/nodekernel writable by the user: a tmpfs of its
#   own unless --data says which host directory it is.
#   IMAGE_DIR is build-image.sh's output directory (with oci/ in it) or an
#   OCI layout itself.
#   Options:
#     --ref REF        the image in the layout (default: its only one,
#                      nodekernel:VERSION)
#     --net MODE       private (default): a network namespace of the
#                      container's own, which runc makes with loopback only;
#                      host: the host's (the host's /etc/hosts and
#                      /etc/resolv.conf mounted too); or a path such as
#                      /var/run/netns/NAME (`ip netns add NAME`) to join
#     --data DIR       bind-mount DIR at /var/lib/nodekernel (DIR is made
#                      if missing, and given to the image's user, 10001:10001,
#                      mode 0700)
#     --bind SRC:DST[:OPTS]  a further bind mount; OPTS are mount options,
#                      comma-separated (ro, rshared, ...); with rshared, a
#                      mount made in the container under DST shows on the
#                      host at SRC (a FUSE sidecar's nk mount) if SRC is a
#                      shared mount point there (mount --bind SRC SRC &&
#                      mount --make-shared SRC); the root is made rshared
#     --hostname NAME  the container's host name (default nodekernel)
#     --fuse           what `nk mount` needs in the container: /dev/fuse,
#                      CAP_SYS_ADMIN in the bounding set (for the set-uid
#                      fusermount3) and no no_new_privileges (the image's
#                      /etc/fuse.conf allows nk mount --allow-other)
#     -- ARGS...       nk's arguments (default: the image's, --help); the
#                      entry point /usr/local/bin/nk stays
#   Then: runc run -d --bundle BUNDLE_DIR ID >OUT 2>ERR </dev/null,
#   runc exec ID nk ..., runc kill ID TERM, runc delete ID.
nk_bundle() {
    local image=$1 bundle=$2 ref='' layout py_args=()
    shift 2
    [[ -d $image/oci ]] && image=$image/oci
    layout=$image
    [[ -f $layout/index.json ]] || { echo "nk_bundle: $image is not an OCI layout (no index.json)" >&2; return 1; }
    while [[ $# -gt 0 ]]; do
        case $1 in
            --ref) ref=$2; shift 2 ;;
            --net|--data|--bind|--hostname) py_args+=("$1" "$2"); shift 2 ;;
            --fuse) py_args+=("$1"); shift ;;
            --) shift; py_args+=(--args "$@"); break ;;
            *) echo "nk_bundle: unknown option $1" >&2; return 2 ;;
        esac
    done
    if [[ -z $ref ]]; then
        ref=$(umoci ls --layout "$layout")
        [[ $(wc -l <<<"$ref") == 1 && -n $ref ]] ||
            { echo "nk_bundle: $layout holds several images or none ($ref): give --ref" >&2; return 1; }
    fi
    local i
    for ((i = 0; i < ${#py_args[@]}; i++)); do
        if [[ ${py_args[i]} == --data ]]; then
            mkdir -p "${py_args[i + 1]}"
            py_args[i + 1]=$(realpath "${py_args[i + 1]}")
        elif [[ ${py_args[i]} == --bind ]]; then
            local src=${py_args[i + 1]%%:*}
            py_args[i + 1]=$(realpath "$src"):${py_args[i + 1]#*:}
        fi
    done
    umoci unpack --image "$layout:$ref" "$bundle" >/dev/null
    python3 - "$bundle/config.json" "${py_args[@]}" <<'PY'
import json
import os
import sys

path, argv = sys.argv[1], sys.argv[2:]
c = json.load(open(path))
proc, linux = c["process"], c.setdefault("linux", {})
# Resource limits: the machine's runtimes cannot set them (crun, runc:
# setrlimit not permitted); without them the container keeps runc's.
proc.pop("rlimits", None)
proc["terminal"] = False
# As docker and podman run a non-root user: no ambient capabilities, so
# none are effective (the bounding set stays umoci's: AUDIT_WRITE, KILL,
# NET_BIND_SERVICE).
proc.get("capabilities", {}).pop("ambient", None)
c["hostname"] = "nodekernel"
c["root"]["readonly"] = True
mounts = c["mounts"]


def tmpfs(dest, *opts):
    mounts.append({"destination": dest, "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", *opts]})


def bind(src, dest, opts):
    mounts.append({"destination": dest, "type": "bind", "source": src,
                   "options": ["rbind", *(opts or ["rw"])]})


tmpfs("/tmp", "mode=1777")
data = None
net = "private"
args = None
i = 0
while i < len(argv):
    a = argv[i]
    if a == "--args":
        args = argv[i + 1:]
        break
    if a == "--fuse":
        linux.setdefault("devices", []).append(
            {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229,
             "fileMode": 0o666, "uid": 0, "gid": 0})
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": "c", "major": 10, "minor": 229, "access": "rwm"})
        caps = proc.setdefault("capabilities", {})
        caps.setdefault("bounding", [])
        if "CAP_SYS_ADMIN" not in caps["bounding"]:
            caps["bounding"].append("CAP_SYS_ADMIN")
        proc["noNewPrivileges"] = False
        i += 1
        continue
    v = argv[i + 1]
    i += 2
    if a == "--net":
        net = v
    elif a == "--data":
        data = v
    elif a == "--hostname":
        c["hostname"] = v
    elif a == "--bind":
        src, rest = v.split(":", 1)
        dest, _, opts = rest.partition(":")
        opts = [o for o in opts.split(",") if o]
        bind(src, dest, opts)
        if "rshared" in opts or "shared" in opts:
            # Mounts made in the container under DEST reach the host (as a
            # mount propagation of Bidirectional does): only with a root
            # that is rshared too, and a SRC that is a shared mount on the
            # host (mount --bind SRC SRC; mount --make-shared SRC).
            linux["rootfsPropagation"] = "rshared"
    else:
        sys.exit(f"nk_bundle: unknown option {a}")
uid, gid = proc["user"]["uid"], proc["user"]["gid"]
if data:
    # The user's own, as the image's /var/lib/nodekernel is.
    os.chown(data, uid, gid)
    os.chmod(data, 0o700)
    bind(data, "/var/lib/nodekernel", [])
else:
    tmpfs("/var/lib/nodekernel", "mode=0700", f"uid={uid}", f"gid={gid}")
namespaces = linux.setdefault("namespaces", [])
if net == "host":
    linux["namespaces"] = [n for n in namespaces if n["type"] != "network"]
    for f in ("/etc/hosts", "/etc/resolv.conf"):
        bind(f, f, ["ro"])
elif net != "private":
    for n in namespaces:
        if n["type"] == "network":
            n["path"] = net
if args is not None:
    proc["args"] = proc["args"][:1] + args
json.dump(c, open(path, "w"), indent=2)
PY
}

# nk_container_pid ID: the host's pid of container ID's first process.
nk_container_pid() {
    runc state "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])'
}

# nk_container_status ID: created, running, stopped (or nothing if unknown).
nk_container_status() {
    runc state "$1" 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || true
}
