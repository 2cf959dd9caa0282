#!/usr/bin/env bash
# Tests NodeKernel's container image (scripts/build-image.sh) in containers
# run by runc: the entry point, `nk up` as the image's non-root user, the
# demo workload inside that container, `nk mount` in it as a FUSE sidecar
# whose mount the host sees, and the roles of a deployment (nk token new,
# nk meta, nk store, a client) each in a container of its own, on two
# network namespaces as two hosts.
#
#   scripts/test-image.sh [--nk PATH] [IMAGE_DIR]
#
# Without IMAGE_DIR it builds the image first (scripts/build-image.sh
# --out target/image, with --nk PATH if given, else a release build of nk)
# and tests that; with it, it tests the image there (build-image.sh's
# output directory, or an OCI layout).
#
# runc, not podman or docker: on this project's machines podman's runtimes
# fail on the resource limits podman always sets; runc runs the bundle that
# nk_bundle (scripts/lib/container.sh) makes, without them. The cluster's
# container has a network namespace of its own (runc makes it: loopback
# only), as a container of podman or docker has by default: the fixed port
# 9060 cannot clash with anything on the host, nothing of the host reaches
# it, and the demo's commands join it with runc exec. Its data directory is
# a host directory bind-mounted at /var/lib/nodekernel, owned by uid 10001
# (the file tier's direct I/O then reaches a real file system, as
# docs/deployment.md says it should).
#
# Needs root; installs runc, umoci (and what build-image.sh needs) if
# missing. The FUSE part needs /dev/fuse: without it, it is skipped with a
# notice, or fails with NK_REQUIRE_FUSE=1. Everything it starts (containers,
# mounts, directories) is removed at exit, also on failure. Its waits only
# catch hangs (10 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

nk=
image=
while [[ $# -gt 0 ]]; do
    case $1 in
        --nk) nk=$2; shift 2 ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        -*) echo "test-image: unknown argument $1 (try --help)" >&2; exit 2 ;;
        *) image=$1; shift ;;
    esac
done
if [[ $(id -u) != 0 ]]; then
    echo "test-image: run as root (runc, bind mounts owned by uid 10001)" >&2
    exit 1
fi
# shellcheck source=scripts/lib/system-deps.sh
source scripts/lib/system-deps.sh
# shellcheck source=scripts/lib/container.sh
source scripts/lib/container.sh
ensure_tools "running the container image" runc=runc umoci=umoci cmp=diffutils ip=iproute2

source scripts/lib/steps.sh
fail() {
    echo "test-image: FAILED: $*" >&2
    exit 1
}

if [[ -z $image ]]; then
    build_args=(--out target/image)
    [[ -n $nk ]] && build_args+=(--nk "$nk")
    step "build the image (scripts/build-image.sh ${build_args[*]})" scripts/build-image.sh "${build_args[@]}"
    image=target/image
fi
image=$(realpath "$image")
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)

WORK=$(mktemp -d /tmp/nk-image-test.XXXXXX)
ID=nk-image-test-$$
containers=()
mounts=()
netns=()
# mounted DIR: something is mounted on DIR (also a FUSE mount whose server
# is gone).
mounted() { awk -v d="$1" '$5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo; }
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    local rc=$? c m
    set +e
    for c in "${containers[@]}"; do
        if [[ -n $(nk_container_status "$c") ]]; then
            if [[ $rc != 0 ]]; then
                echo "-- $c's output (stderr, last lines):" >&2
                tail -n 20 "$WORK/$c.err" >&2 2>/dev/null
            fi
            runc kill "$c" KILL 2>/dev/null
            runc delete --force "$c" 2>/dev/null
        fi
    done
    # The FUSE mount's server died with its container (its mount point
    # cannot even be stat'ed now): detach it, then the bind mount under it.
    for m in "${mounts[@]}"; do
        while mounted "$m"; do umount -l "$m" || break; done
    done
    for m in "${netns[@]}"; do ip netns del "$m" 2>/dev/null; done
    # Never into a mount that is left.
    if ! grep -q " $WORK/" /proc/self/mountinfo; then rm -rf "$WORK"; else echo "test-image: left $WORK (mounts in it)" >&2; fi
    steps_summary "test-image: step times"
    if [[ $rc == 0 ]]; then echo "test-image: passed"; else echo "test-image: FAILED" >&2; fi
    return "$rc"
}
trap cleanup EXIT
# Interrupted or killed (a CI timeout): the same clean-up.
trap 'exit 130' INT
trap 'exit 143' TERM

# Generous: only a hang takes this long.
WAIT_S=600

entry_point() {
    local c=$ID-help out
    nk_bundle "$image" "$WORK/help"
    containers+=("$c")
    runc run --bundle "$WORK/help" "$c" </dev/null >"$WORK/$c.out" 2>"$WORK/$c.err" ||
        fail "the container with the image's own arguments exited with $?"
    runc delete --force "$c" 2>/dev/null || true
    out=$(cat "$WORK/$c.out")
    head -n 3 <<<"$out"
    [[ $out == *"Usage: nk [OPTIONS] <COMMAND>"* ]] || fail "no args: not nk's help: $out"
    [[ $out == *"up "*"meta "*"store "*"mount "* ]] || fail "nk's help lacks the server roles"
    python3 - "$WORK/help/config.json" <<'PY' || fail "the image's entry point or user"
import json, sys
p = json.load(open(sys.argv[1]))["process"]
assert p["args"] == ["/usr/local/bin/nk", "--help"], p["args"]
assert (p["user"]["uid"], p["user"]["gid"]) == (10001, 10001), p["user"]
assert p["cwd"] == "/var/lib/nodekernel", p["cwd"]
print("entry point", p["args"][0], "cmd", p["args"][1:], "user", p["user"], "cwd", p["cwd"])
PY
}
step "entry point: the container with no arguments prints nk's help" entry_point

# The cluster's container: nk up on port 9060 of its network namespace,
# the data directory on the host, the demo's input read-only at /input and,
# with FUSE, a host directory shared with the container's mounts at /mnt/nk.
C=$ID-up
fuse=0
if [[ -e /dev/fuse ]]; then
    fuse=1
elif [[ ${NK_REQUIRE_FUSE:-} == 1 ]]; then
    fail "/dev/fuse is missing (NK_REQUIRE_FUSE=1)"
else
    echo "note: no /dev/fuse here: the nk mount part is skipped"
fi
start_cluster() {
    local opts=(--data "$WORK/data" --bind "$WORK/input:/input:ro")
    mkdir -p "$WORK/input"
    head -c $((32 * 1024 * 1024)) /dev/urandom >"$WORK/input/input.bin"
    head -c 300000 /dev/urandom >"$WORK/stdin.bin"
    chmod 0755 "$WORK/input"
    chmod 0644 "$WORK/input/input.bin"
    if ((fuse)); then
        mkdir -p "$WORK/mnt"
        chown 10001:10001 "$WORK/mnt"
        mount --bind "$WORK/mnt" "$WORK/mnt"
        mounts+=("$WORK/mnt")
        mount --make-shared "$WORK/mnt"
        opts+=(--fuse --bind "$WORK/mnt:/mnt/nk:rshared")
    fi
    nk_bundle "$image" "$WORK/up" "${opts[@]}" -- \
        up --port 9060 --dram 256MiB --file 256MiB --data-dir /var/lib/nodekernel/up
    containers+=("$C")
    runc run -d --bundle "$WORK/up" "$C" </dev/null >"$WORK/$C.out" 2>"$WORK/$C.err"
    local t0=$SECONDS
    until grep -q "metadata server at" "$WORK/$C.out"; do
        [[ $(nk_container_status "$C") == running ]] ||
            fail "nk up's container is $(nk_container_status "$C"): $(tail -n 20 "$WORK/$C.err")"
        ((SECONDS - t0 < WAIT_S)) || fail "nk up did not report its address in $WAIT_S s"
        sleep 0.2
    done
    cat "$WORK/$C.out"
    # Readiness is explicit: the storage servers are alive.
    in_c nk status --wait --timeout "$WAIT_S" | tail -n 1
}
# in_c ARGS...: runs ARGS in the cluster's container (as its user, 10001).
in_c() { runc exec "$C" "$@"; }
step "nk up in a container (runc run -d, the image's user, port 9060 of its own network namespace)" start_cluster

users() {
    local pid uid gid
    pid=$(nk_container_pid "$C")
    uid=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
    gid=$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
    echo "container's init (host pid $pid, $(tr '\0' ' ' <"/proc/$pid/cmdline")): Uid $uid, Gid $gid"
    [[ $uid == "10001 10001 10001 10001" && $gid == "10001 10001 10001 10001" ]] ||
        fail "nk up runs as uid/gid $uid/$gid, not 10001"
    [[ $(awk '/^CapEff:/ { print $2 }' "/proc/$pid/status") == 0000000000000000 ]] ||
        fail "nk up has effective capabilities: $(grep ^Cap "/proc/$pid/status")"
    # Everything nk up wrote in its data directory is the user's.
    local foreign
    foreign=$(find "$WORK/data" \( ! -uid 10001 -o ! -gid 10001 \) -print)
    [[ -z $foreign ]] || fail "files in the data directory not owned by 10001: $foreign"
    echo "data directory: $(find "$WORK/data" | wc -l) entries, every one owned by 10001:10001"
}
step "nk up runs as uid 10001, without capabilities; its files are 10001's" users

demo() {
    in_c nk mkdir -p /demo/jobs/job1
    in_c nk put /input/input.bin /demo/jobs/job1/input.bin
    in_c nk cat /demo/jobs/job1/input.bin >"$WORK/cat.bin"
    cmp "$WORK/input/input.bin" "$WORK/cat.bin" || fail "nk cat of the 32 MiB file differs"
    echo "  32 MiB file: nk put from /input, nk cat back: identical"
    in_c nk put - /demo/jobs/job1/stdin.bin <"$WORK/stdin.bin"
    in_c nk cat /demo/jobs/job1/stdin.bin | cmp "$WORK/stdin.bin" - || fail "nk put - / nk cat differ"
    echo "  nk put - (the host's stdin through runc exec), nk cat back: identical"
    in_c nk get /demo/jobs/job1/input.bin /var/lib/nodekernel/got.bin
    cmp "$WORK/input/input.bin" "$WORK/data/got.bin" || fail "nk get into the data directory differs"
    [[ $(stat -c %u:%g "$WORK/data/got.bin") == 10001:10001 ]] ||
        fail "runc exec's nk wrote got.bin as $(stat -c %u:%g "$WORK/data/got.bin")"
    echo "  nk get into /var/lib/nodekernel: identical, written as 10001:10001"

    in_c nk mkdir --type table /demo/cache
    local i v
    for i in 1 2 3; do in_c nk kv put "/demo/cache/key$i" "value number $i"; done
    in_c nk kv put /demo/cache/key1 "replaced value"
    for i in 1 2 3; do
        v=$(in_c nk kv get "/demo/cache/key$i")
        local want="value number $i"
        [[ $i == 1 ]] && want="replaced value"
        [[ $v == "$want" ]] || fail "kv get key$i: $v, not $want"
        echo "  kv get /demo/cache/key$i = $v"
    done
    in_c nk mkdir --type bag /demo/shuffle
    in_c nk put /input/input.bin /demo/shuffle/map-0
    in_c nk cat /demo/shuffle | cmp "$WORK/input/input.bin" - || fail "the bag's stream differs"
    echo "  bag /demo/shuffle: one map output, read back as one stream: identical"

    local ls
    ls=$(in_c nk ls /demo/cache)
    echo "\$ nk ls /demo/cache"
    echo "$ls"
    for i in 1 2 3; do [[ $ls == *key$i* ]] || fail "nk ls /demo/cache lacks key$i"; done
    ls=$(in_c nk ls /demo/jobs/job1)
    [[ $ls == *input.bin* && $ls == *stdin.bin* ]] || fail "nk ls /demo/jobs/job1: $ls"

    in_c nk status --json >"$WORK/status.json"
    python3 - "$WORK/status.json" <<'PY' || fail "nk status --json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ready"] and s["alive_servers"] == s["expected_servers"] == 2, s
media = sorted(v["medium"] for v in s["servers"])
assert media == ["dram", "file"], media
assert all(v["alive"] for v in s["servers"]), s["servers"]
used = sum(v["used_bytes"] for v in s["servers"])
assert used >= 2 * 32 * 2**20, used
print(f"  nk status --json: ready, servers {media} alive, {used / 2**20:.0f} MiB used, {s['nodes']} nodes")
PY
}
step "the demo workload inside the container (runc exec nk ...)" demo

sidecar() {
    in_c nk mkdir /demo/shared
    in_c nk put /input/input.bin /demo/shared/data.bin
    in_c nk mount /mnt/nk --root /demo/shared --allow-other
    # A program of the container reads through the mount ...
    in_c nk put /mnt/nk/data.bin /demo/through-fuse.bin
    in_c nk cat /demo/through-fuse.bin | cmp "$WORK/input/input.bin" - ||
        fail "the file read through the mount in the container differs"
    echo "  in the container: /mnt/nk/data.bin (read through FUSE) is the file put"
    # ... and so does the host (root, another user), where the mount propagated.
    grep -q " $WORK/mnt .* - fuse.nk " /proc/self/mountinfo || fail "the mount did not reach the host"
    cmp "$WORK/input/input.bin" "$WORK/mnt/data.bin" || fail "the host reads a different file"
    printf 'written by the host\n' >"$WORK/mnt/from-host.txt"
    [[ $(in_c nk cat /demo/shared/from-host.txt) == "written by the host" ]] ||
        fail "the host's file through the mount"
    echo "  on the host at $WORK/mnt: the same file; a file the host wrote there is in the cluster"
    in_c nk umount /mnt/nk
    ! grep -q " $WORK/mnt .* - fuse.nk " /proc/self/mountinfo || fail "nk umount left the mount on the host"
}
if ((fuse)); then
    step "nk mount in the container as a FUSE sidecar (the host sees the mount)" sidecar
fi

stop_cluster() {
    in_c nk rm -r /demo
    runc kill "$C" TERM
    local t0=$SECONDS
    until [[ $(nk_container_status "$C") == stopped ]]; do
        ((SECONDS - t0 < WAIT_S)) || fail "nk up did not stop on SIGTERM in $WAIT_S s"
        sleep 0.2
    done
    tail -n 1 "$WORK/$C.out"
    grep -q "SIGTERM: stopping NodeKernel" "$WORK/$C.out" || fail "nk up did not say it stopped on SIGTERM"
    runc delete "$C"
}
step "stop: SIGTERM to the container (nk up is its PID 1)" stop_cluster

# The roles of a real deployment, each in a container of its own: nk token
# new writes the cluster token, nk meta runs on "host A" and nk store on
# "host B" (two network namespaces joined by a veth pair, as two hosts on a
# network: ip netns add), both with the configuration the way
# docs/deployment.md says for containers (wildcard listen addresses, the
# store advertising its host's address), and a client on host A (runc exec
# into the meta container) writes through the store on host B.
NS_A=nkimg$$a
NS_B=nkimg$$b
roles() {
    local etc=$WORK/etc meta=$ID-meta store=$ID-store
    netns+=("$NS_A")
    ip netns add "$NS_A"
    netns+=("$NS_B")
    ip netns add "$NS_B"
    ip -n "$NS_A" link add eth0 type veth peer name eth0 netns "$NS_B"
    local pair ns
    for pair in "$NS_A=10.250.0.1" "$NS_B=10.250.0.2"; do
        ns=${pair%%=*}
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "${pair#*=}/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    mkdir -p "$etc"
    cat >"$etc/cluster.toml" <<'TOML'
[meta]
listen = "0.0.0.0:9060"
expect_servers = 1

[security]
token_file = "/etc/nodekernel/token"

[client]
meta = ["10.250.0.1:9060"]
location = "host-a"

[[store]]
class = 0
class_name = "dram"
medium = "dram"
size = "64MiB"
listen = "0.0.0.0:9070"
advertise = "10.250.0.2:9070"
location = "host-b"
TOML
    chmod 0644 "$etc/cluster.toml"
    # nk token new writes the token as the image's user, into a directory
    # that user may write; the servers get it read-only.
    chown 10001:10001 "$etc"
    nk_bundle "$image" "$WORK/token" --bind "$etc:/etc/nodekernel" -- token new /etc/nodekernel/token
    containers+=("$ID-token")
    runc run --bundle "$WORK/token" "$ID-token" </dev/null
    runc delete --force "$ID-token" 2>/dev/null || true
    [[ $(stat -c '%u:%g %a' "$etc/token") == "10001:10001 600" ]] ||
        fail "the token file is $(stat -c '%u:%g %a' "$etc/token"), not 10001:10001 600"
    local c net host
    for c in meta store; do
        net=/var/run/netns/$NS_A host=host-a
        [[ $c == store ]] && net=/var/run/netns/$NS_B host=host-b
        nk_bundle "$image" "$WORK/$c" --net "$net" --hostname "$host" \
            --bind "$etc:/etc/nodekernel:ro" -- "$c" --config /etc/nodekernel/cluster.toml
        containers+=("$ID-$c")
        runc run -d --bundle "$WORK/$c" "$ID-$c" </dev/null >"$WORK/$ID-$c.out" 2>"$WORK/$ID-$c.err"
    done
    local client=(runc exec --env NK_CONFIG=/etc/nodekernel/cluster.toml "$meta" nk)
    "${client[@]}" status --wait --timeout "$WAIT_S" | tail -n 1
    "${client[@]}" put - /roles.bin <"$WORK/stdin.bin"
    "${client[@]}" cat /roles.bin | cmp "$WORK/stdin.bin" - || fail "the file through the store on host B differs"
    "${client[@]}" status --json >"$WORK/roles.json"
    python3 - "$WORK/roles.json" <<'PY' || fail "nk status --json of the two-host cluster"
import json, sys
s = json.load(open(sys.argv[1]))
servers = [(v["addr"], v["location"], v["used_bytes"]) for v in s["servers"]]
assert len(servers) == 1 and servers[0][:2] == ("10.250.0.2:9070", "host-b") and servers[0][2] > 0, servers
print(f"  client on host A: a file put and read back through the store at {servers[0][0]} ({servers[0][1]})")
PY
    local t0
    for c in "$store" "$meta"; do
        runc kill "$c" TERM
        t0=$SECONDS
        until [[ $(nk_container_status "$c") == stopped ]]; do
            ((SECONDS - t0 < WAIT_S)) || fail "$c did not stop on SIGTERM in $WAIT_S s"
            sleep 0.2
        done
        tail -n 1 "$WORK/$c.out"
        runc delete "$c"
    done
}
step "every role in a container of its own: token, nk meta on host A, nk store on host B, a client" roles
echo "image nodekernel:$VERSION in $image: entry point, nk up, demo$( ((fuse)) && echo ', nk mount sidecar'), every role passed"
