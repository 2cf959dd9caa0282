# Installs the Debian packages the scripts need when one of their commands
# is missing (as root, with apt-get); otherwise says what is missing.
# Usage: ensure_tools "why" tool=package ...

ensure_tools() {
    local why=$1; shift
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "== apt-get install ${missing[*]} ($why) =="
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" ||
            { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; }
    else
        echo "note: ${missing[*]} missing ($why); install them to use it" >&2
    fi
}
