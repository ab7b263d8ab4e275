#!/usr/bin/env bash
# deploy/docker-compose.yml, up for real with podman and no registry (issue 24).
#
# As root on Debian 12:
#   1. installs podman, runc, iptables, debootstrap and docker-compose (1.29) from Debian;
#   2. builds the images with no registry: a Debian base from debootstrap, the
#      PostgreSQL stand-in (deploy/podman/postgres, Debian's postgresql-15) and
#      Ferrum's image (deploy/Dockerfile) on that base; each is tagged with a hash
#      of what it is built from, and a run finds it in podman's storage and skips
#      the build;
#   3. brings the compose file up through docker-compose talking to a private
#      `podman system service` socket: PostgreSQL, migrations, api, two
#      conductors, the renderer, the object store and the simulator's 8 machines;
#   4. from the host, over REST (scripts/compose_flow.py): enrolls the machines,
#      deploys the demo image with a config drive, checks every disk against the
#      image and each machine's config drive, undeploys; then deploys again,
#      `podman kill`s the conductor that owns the deploys in flight and checks
#      that the other one finishes them;
#   5. tears everything down (containers, network, volumes, the podman service),
#      keeping only the cached images.
#
# The podman-specific host settings live here, not in the compose file, which
# stays usable with a real Docker engine and the official postgres image:
# runtime runc and ulimits within this host's hard limits (a private
# containers.conf, CONTAINERS_CONF), health checks run by this script (podman
# 4.3 runs them from systemd timers, and there is no systemd here), published
# ports picked free on 127.0.0.1, and the image names.
#
#   sudo bash scripts/compose-demo.sh
# Environment: FERRUM_COMPOSE_KEEP=1 leaves the stack up (prints how to tear it down).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$(date +%s)
say() { echo "compose-demo: [$(($(date +%s) - START))s] $*"; }
die() { echo "compose-demo: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (podman's networks and debootstrap need it)"
[ -r /etc/debian_version ] || die "needs Debian 12 (apt-get, debootstrap)"

# ---- 1. packages ------------------------------------------------------------------------
PACKAGES=(podman runc iptables netavark aardvark-dns debootstrap docker-compose openssl gdisk e2fsprogs)
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
[ -x .venv/bin/python ] || bash scripts/bootstrap.sh  # the host side runs on Ferrum's own venv
[ -n "$(ls ferrum/v1/*_pb2.py 2>/dev/null)" ] || .venv/bin/python scripts/gen_protos.py

# ---- podman, privately -----------------------------------------------------------------
WORK=$(mktemp -d /tmp/ferrum-compose-XXXXXX)
chmod 0755 "$WORK"
PROJECT="ferrumdemo$$"
PODMAN_PID=""
HEALTH_PID=""
COMPOSE_UP=0
export CONTAINERS_CONF="$WORK/containers.conf"
hard_nofile=$(ulimit -Hn)
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
cat >"$CONTAINERS_CONF" <<EOF
# crun refuses this VM's hybrid cgroup layout; without CAP_SYS_RESOURCE the
# containers' limits must fit under the host's hard limits; netavark with
# aardvark-dns resolves the compose service names (CNI without the dnsname
# plugin does not: "Name or service not known").
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=32768:32768"]
[engine]
runtime = "runc"
[network]
network_backend = "netavark"
EOF
export DOCKER_HOST="unix://$WORK/podman.sock"
compose() { docker-compose -p "$PROJECT" -f deploy/docker-compose.yml "$@"; }

cleanup() {
    local rc=$?
    set +e
    [ -n "$HEALTH_PID" ] && kill "$HEALTH_PID" 2>/dev/null && wait "$HEALTH_PID" 2>/dev/null
    if [ "$COMPOSE_UP" = 1 ]; then
        if [ "$rc" != 0 ]; then
            say "failed; the services' last log lines:"
            compose logs --no-color --tail=30 2>&1 | tail -150
        fi
        if [ "${FERRUM_COMPOSE_KEEP:-0}" = 1 ]; then
            say "left up: DOCKER_HOST=$DOCKER_HOST CONTAINERS_CONF=$CONTAINERS_CONF docker-compose -p $PROJECT -f deploy/docker-compose.yml down -v; then kill $PODMAN_PID"
            exit "$rc"
        fi
        say "tearing down"
        compose down -v --timeout 10 >/dev/null 2>&1 || echo "compose-demo: warning: docker-compose down failed" >&2
    fi
    if [ -n "$PODMAN_PID" ]; then kill "$PODMAN_PID" 2>/dev/null && wait "$PODMAN_PID" 2>/dev/null; fi
    rm -rf "$WORK"
    say "done (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

podman system service --time=0 "$DOCKER_HOST" >"$WORK/podman-service.log" 2>&1 &
PODMAN_PID=$!
for _ in $(seq 100); do [ -S "$WORK/podman.sock" ] && break; sleep 0.1; done
[ -S "$WORK/podman.sock" ] || die "podman system service did not start: $(cat "$WORK/podman-service.log")"

# ---- 2. images, cached by what they are built from -------------------------------------
hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }
MIRROR=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" && $0 ~ / main/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
DEBOOTSTRAP=(debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm)
BASE_KEY=$( { echo "${DEBOOTSTRAP[*]} $MIRROR"; cat "$CA_BUNDLE"; } | sha256sum | cut -c1-16)
BASE_IMAGE="localhost/ferrum-base:bookworm-$BASE_KEY"
PG_KEY=$( { echo "$BASE_KEY"; cat deploy/podman/postgres/*; } | sha256sum | cut -c1-16)
export FERRUM_POSTGRES_IMAGE="localhost/ferrum-postgres:$PG_KEY"
mapfile -d '' SOURCES < <(git ls-files -z pyproject.toml README.md protos scripts/gen_protos.py services)
FERRUM_KEY=$( { echo "$BASE_KEY"; cat deploy/Dockerfile .dockerignore; hash_of "${SOURCES[@]}"; } | sha256sum | cut -c1-16)
export FERRUM_IMAGE="localhost/ferrum:$FERRUM_KEY"

if podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE cached"
else
    say "building $BASE_IMAGE with debootstrap from $MIRROR"
    rootfs="$WORK/rootfs"
    "${DEBOOTSTRAP[@]}" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || die "debootstrap failed: $(tail -20 "$WORK/debootstrap.log")"
    # HTTPS to the package registries may pass an intercepting proxy: trust what the host trusts.
    cp "$CA_BUNDLE" "$rootfs$CA_BUNDLE"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --message "debootstrap bookworm minbase" - "$BASE_IMAGE" >/dev/null 2>&1
    rm -rf "$rootfs"
fi
# Builds use the host network: their apt and pip downloads need no NAT or container DNS.
BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PIP_CERT=$CA_BUNDLE")
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
    # Only a network index reaches into the build; file:// indexes of this host do not.
    case "${!var:-}" in http*) BUILD_ARGS+=(--build-arg "$var=${!var}") ;; esac
done
if podman image exists "$FERRUM_POSTGRES_IMAGE"; then
    say "postgres image $FERRUM_POSTGRES_IMAGE cached"
else
    say "building $FERRUM_POSTGRES_IMAGE (Debian's postgresql-15)"
    podman build -q --network host "${BUILD_ARGS[@]}" -t "$FERRUM_POSTGRES_IMAGE" deploy/podman/postgres >"$WORK/build-postgres.log" 2>&1 \
        || die "building the postgres image failed: $(tail -30 "$WORK/build-postgres.log")"
fi
if podman image exists "$FERRUM_IMAGE"; then
    say "ferrum image $FERRUM_IMAGE cached"
else
    say "building $FERRUM_IMAGE (deploy/Dockerfile)"
    podman build -q --network host "${BUILD_ARGS[@]}" -f deploy/Dockerfile -t "$FERRUM_IMAGE" . >"$WORK/build-ferrum.log" 2>&1 \
        || die "building Ferrum's image failed: $(tail -30 "$WORK/build-ferrum.log")"
    # The build stage and the layers of earlier builds are left untagged; they would add ~235 MB a build.
    podman image prune -f >/dev/null 2>&1 || true
fi
# Older builds of Ferrum's image (other keys) are dropped; the base and postgres images are few.
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/ferrum:' | grep -vx "$FERRUM_IMAGE" \
    | xargs -r podman rmi >/dev/null 2>&1 || true

# ---- 3. up ----------------------------------------------------------------------------------
POSTGRES_PASSWORD=$(openssl rand -hex 16)
FERRUM_DB_PASSWORD=$(openssl rand -hex 16)
export POSTGRES_PASSWORD FERRUM_DB_PASSWORD
read -r FERRUM_API_HOST_PORT FERRUM_IPXE_HOST_PORT FERRUM_OBJECTSTORE_HOST_PORT FERRUM_SIMULATOR_HOST_PORT < <(
    .venv/bin/python -c 'from services.common.ports import unused_tcp_ports; print(*unused_tcp_ports(4))')
export FERRUM_API_HOST_PORT FERRUM_IPXE_HOST_PORT FERRUM_OBJECTSTORE_HOST_PORT FERRUM_SIMULATOR_HOST_PORT

# podman 4.3 runs health checks from systemd timers; here this loop runs them.
run_health_checks() {
    while sleep 1; do
        podman ps --filter "label=com.docker.compose.project=$PROJECT" --filter health=starting --format '{{.ID}}' \
            | while read -r id; do podman healthcheck run "$id" >/dev/null 2>&1 || true; done
    done
}
run_health_checks &
HEALTH_PID=$!

say "docker-compose up (project $PROJECT)"
COMPOSE_UP=1
UP_STARTED=$(date +%s)
compose up -d --no-build >"$WORK/compose-up.log" 2>&1 || die "docker-compose up failed: $(tail -30 "$WORK/compose-up.log")"
say "docker-compose up -d returned after $(($(date +%s) - UP_STARTED)) s (PostgreSQL healthy, migrations done)"
API="http://127.0.0.1:$FERRUM_API_HOST_PORT"
for _ in $(seq 300); do curl -fsS -o /dev/null "$API/" 2>/dev/null && break; sleep 0.2; done
curl -fsS -o /dev/null "$API/" || die "the api did not answer on $API"
say "api answering $(($(date +%s) - UP_STARTED)) s after up"

# ---- 4. the deploy flow and a conductor take-over, from the host ---------------------------
container_of() { echo "${PROJECT}_$1_1"; }
TOKEN_FILE="$WORK/internal-token"
# Wait for a service to generate the internal token, then read it as the operator would.
for _ in $(seq 150); do
    podman exec "$(container_of postgres)" psql -qtAX -U postgres -d ferrum \
        -c "SELECT value FROM service_secrets WHERE name = 'internal-grpc-token'" >"$TOKEN_FILE" 2>/dev/null || true
    [ -s "$TOKEN_FILE" ] && break
    sleep 0.2
done
[ -s "$TOKEN_FILE" ] || die "no internal token in PostgreSQL"
chmod 0600 "$TOKEN_FILE"
MACHINES_DIR=$(podman volume inspect "${PROJECT}_machines" --format '{{.Mountpoint}}')
.venv/bin/python scripts/compose_flow.py \
    --api "$API" \
    --objectstore "127.0.0.1:$FERRUM_OBJECTSTORE_HOST_PORT" \
    --token-file "$TOKEN_FILE" \
    --simulator "http://127.0.0.1:$FERRUM_SIMULATOR_HOST_PORT" \
    --machines-dir "$MACHINES_DIR" \
    --work "$WORK" \
    --kill-command "podman kill ${PROJECT}_{conductor}_1"
say "compose demo passed"
