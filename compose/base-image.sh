#!/usr/bin/env bash
# A base image for the Compose stack made from Debian's own packages, for a machine that cannot pull
# from Docker Hub (the stack's defaults, python:3.12-slim and redis:7.4, come from there):
#
#   sudo compose/base-image.sh                       # makes local/gpulayer-base:bookworm
#   BASE_IMAGE=local/gpulayer-base:bookworm GPULAYER_REDIS_IMAGE=local/gpulayer-base:bookworm \
#     docker-compose -f compose/compose.yaml up -d --build
#
# It holds Debian's minimal system with Python 3 (and its venv module) for compose/Dockerfile, the CA
# certificates, and Debian's redis-server for the stack's Redis, with /data owned by the user redis
# as in the official Redis image. Needs root, debootstrap and a Docker engine; Debian's packages are
# fetched from GPULAYER_BASE_MIRROR, else from the first mirror this machine's apt uses. An image of
# that name already there is kept (remove it to make it again). docs/deploy.md says more.
set -euo pipefail

image="${1:-local/gpulayer-base:bookworm}"
suite="${GPULAYER_BASE_SUITE:-bookworm}"
packages="python3,python3-venv,ca-certificates,redis-server"

say() { echo "base-image.sh: $*" >&2; }

# The first Debian mirror apt is configured with (deb822 sources first, then sources.list), leaving
# out the security archive, which holds updates only.
apt_mirror() {
    for sources in /etc/apt/sources.list.d/*.sources; do
        [ -f "$sources" ] || continue
        mirror="$(awk '$1 == "URIs:" && $2 !~ /security/ {print $2; exit}' "$sources")"
        if [ -n "$mirror" ]; then echo "$mirror"; return; fi
    done
    [ -f /etc/apt/sources.list ] &&
        awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
            /etc/apt/sources.list
}

if docker image inspect "$image" >/dev/null 2>&1; then
    say "$image is already there (docker image rm $image to make it again)"
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || { say "needs debootstrap (apt-get install debootstrap)"; exit 1; }
mirror="${GPULAYER_BASE_MIRROR:-$(apt_mirror)}"
[ -n "$mirror" ] || { say "no Debian mirror in apt's sources: set GPULAYER_BASE_MIRROR=URL"; exit 1; }

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
say "making $image from Debian $suite's packages ($packages)"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
rm -rf "$rootfs/var/lib/apt/lists"
# The official Redis image's /data: the user redis's, so the stack's Redis runs as that user, not root.
owner="$(awk -F: '$1 == "redis" {print $3 ":" $4}' "$rootfs/etc/passwd")"
[ -n "$owner" ] || { say "redis-server made no user redis in $suite"; exit 1; }
mkdir "$rootfs/data"
chown "$owner" "$rootfs/data"
tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
say "made $image"
