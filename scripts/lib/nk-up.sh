# Starts a one-process cluster for a benchmark script: `nk up --port 0`
# with the given arguments, in the background, its output in LOG (and
# LOG.err). Sets UP_PID, and exports NK_META once the storage servers are
# ready. Needs NK (the nk binary). Source it from the repository root.
#   nk_up_start "$WORK/up.log" --dram 2GiB --file 12GiB --data-dir "$WORK/data"
nk_up_start() {
    local log=$1
    shift
    "$NK" up --port 0 "$@" >"$log" 2>"$log.err" &
    UP_PID=$!
    for _ in $(seq 1 300); do
        grep -q "metadata server at" "$log" 2>/dev/null && break
        sleep 0.1
    done
    NK_META=$(sed -n 's/.*metadata server at \([^ ]*\).*/\1/p' "$log" | head -n 1)
    export NK_META
    "$NK" status --wait >/dev/null
}
