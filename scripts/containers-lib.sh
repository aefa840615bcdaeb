# Sourced by the containers-*.sh scripts: build metadata passed as build args.
# The revision is always a full commit id (never a branch); a dirty tree is reported.
civetta_revision() {
    local root="$1"
    git -C "$root" rev-parse --verify HEAD 2>/dev/null || {
        echo "containers: $root is not a git checkout with a commit; the image revision label needs one" >&2
        return 1
    }
}
civetta_version() {
    # First `version = "..."` of Cargo.toml's [package] table.
    awk -F'"' '/^\[package\]/{p=1;next} /^\[/{p=0} p && /^version *=/{print $2; exit}' "$1/Cargo.toml"
}
civetta_created() {
    git -C "$1" log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ
}
civetta_dirty_note() {
    if [[ -n "$(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        echo "containers: note: the working tree has uncommitted changes; the revision label names HEAD" >&2
    fi
}
# Sourced by the containers-*.sh scripts: podman settings that work on hosts
# without systemd, with a hybrid cgroup layout and a capped open-files limit
# (see docs/IMAGES.md, "Podman on CI hosts").
#
# * crun fails there (setrlimit RLIMIT_NOFILE, hybrid cgroups): use runc.
# * podman's default ulimits exceed the hard limit: pin them to it.
# Respect a CONTAINERS_CONF the caller already set.
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
    _civetta_conf="${TMPDIR:-/tmp}/civetta-containers.conf"
    _hard_nofile="$(ulimit -Hn)"
    [[ "$_hard_nofile" == unlimited ]] && _hard_nofile=1048576
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n' \
        "$_hard_nofile" "$_hard_nofile" > "$_civetta_conf"
    export CONTAINERS_CONF="$_civetta_conf"
fi
# The tag of the locally built Debian base image (scripts/containers-base.sh).
CIVETTA_BASE_IMAGE="${CIVETTA_BASE_IMAGE:-localhost/debian:bookworm-min}"
