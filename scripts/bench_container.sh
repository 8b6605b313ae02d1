#!/usr/bin/env bash
# The benchmark's Docker route, run for real: build Dockerfile.bench and run
# `python -m benchmarks run --smoke` in the container against this machine's services.
#
# No image registry is reachable here, so the base image is made with debootstrap (Debian
# bookworm) holding the Python that builds the wheels (BENCH_PYTHON, .venv's by default), and
# pip in the build installs wheels built on the host, served on 127.0.0.1 (the build and the
# container use the host's network: no bridge, no iptables rule, nothing of the host's network
# settings touched). A Docker engine is started if none answers, and stopped at the end.
#
#   scripts/bench_container.sh
#   scripts/bench_container.sh build    only the base, the wheels and the image (CI starts it
#                                       early, beside the tests, then runs the whole)
#   BENCH_DOCKER_DIR=/path scripts/bench_container.sh   the engine's images, kept between runs
set -euo pipefail
stage=${1:-all}
case "$stage" in all | build) ;; *) echo "usage: $0 [build]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
SECONDS=0
state=${BENCH_DOCKER_DIR:-/var/lib/django-sqltasks-docker}
python=${BENCH_PYTHON:-.venv/bin/python}
port=${BENCH_WHEEL_PORT:-56480}  # fixed: it is in a build argument, which keys the build cache
base=local/python-bookworm:$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
image=django-sqltasks-bench:local
mkdir -p "$state"
docker=$(command -v /usr/bin/docker docker | head -1 || true)
if [ -z "$docker" ] || ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap >/dev/null
    docker=/usr/bin/docker
fi
export DOCKER_HOST=${DOCKER_HOST:-unix://$state/docker.sock} DOCKER_BUILDKIT=0
engine= server=
stop() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    if [ -n "$engine" ]; then kill "$engine" 2>/dev/null && wait "$engine" 2>/dev/null || true; fi
}
trap stop EXIT
step() { printf '[bench_container %ss] %s\n' "$SECONDS" "$*"; }

if ! "$docker" info >/dev/null 2>&1; then
    step "starting dockerd (log: $state/dockerd.log)"
    dockerd --iptables=false --ip-masq=false --bridge=none --data-root "$state/data" \
        --exec-root "$state/exec" -H "$DOCKER_HOST" >"$state/dockerd.log" 2>&1 &
    engine=$!
    for _ in $(seq 120); do "$docker" info >/dev/null 2>&1 && break; sleep 0.5; done
fi

if ! "$docker" image inspect "$base" >/dev/null 2>&1; then
    # The Python installation itself (a pyenv build, say) at its own path, with the libraries
    # its modules link, and pip from its ensurepip; none of the host's installed packages.
    prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
    step "building $base: debootstrap bookworm and $prefix"
    root=$(mktemp -d "$state/rootfs.XXXXXX")
    debootstrap --variant=minbase \
        --include=ca-certificates,libssl3,libsqlite3-0,libffi8,zlib1g,libbz2-1.0,liblzma5,libreadline8,libncursesw6,libuuid1,libexpat1 \
        bookworm "$root" http://deb.debian.org/debian >"$state/debootstrap.log"
    mkdir -p "$root$prefix"
    tar -C "$prefix" --exclude='./lib/python3.*/test' --exclude='./lib/python3.*/site-packages/*' \
        --exclude='*.a' -c . | tar -C "$root$prefix" -x
    chroot "$root" "$prefix/bin/python3" -m ensurepip --default-pip >/dev/null
    for name in python python3 pip pip3; do ln -sf "$prefix/bin/$name" "$root/usr/local/bin/$name"; done
    tar -C "$root" -c . | "$docker" import --change 'CMD ["python3"]' - "$base" >/dev/null
    rm -rf "$root"
fi

wheels=$state/wheels-$(basename "$base" | tr : -)
if ! cmp -s benchmarks/requirements.txt "$wheels/requirements.txt"; then
    step "building the wheels of benchmarks/requirements.txt into $wheels"
    rm -rf "$wheels"
    "$python" -m pip wheel --quiet --disable-pip-version-check -w "$wheels" \
        -r benchmarks/requirements.txt setuptools
    cp benchmarks/requirements.txt "$wheels/requirements.txt"
fi
"$python" -m http.server --bind 127.0.0.1 "$port" --directory "$wheels" >/dev/null 2>&1 &
server=$!
# The version the results name: the image has no .git.
commit=$(git rev-parse HEAD 2>/dev/null || true)
if [ -n "$commit" ] && [ -n "$(git status --porcelain -- django_sqltasks)" ]; then commit="$commit+dirty"; fi

step "building $image on $base"
"$docker" build --quiet --network host -f Dockerfile.bench -t "$image" \
    --build-arg BASE_IMAGE="$base" \
    --build-arg PIP_OPTIONS="--no-index --find-links http://127.0.0.1:$port/" \
    --build-arg SQLTASKS_COMMIT="$commit" . >/dev/null
kill "$server" && server=
if [ "$stage" = build ]; then step "built"; exit 0; fi

step "python -m benchmarks run --smoke in the container"
"$docker" run --rm --network host "$image" run --smoke
step "done"
