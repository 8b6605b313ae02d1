#!/usr/bin/env bash
# Create or update a virtual environment with the project, its test tools and linters.
#
#   scripts/venv.sh                 .venv on Python >= 3.12 with Django 6 (the default)
#   VENV=.venv-52 DJANGO=5.2 scripts/venv.sh     Django 5.2 with the django-tasks backport
#   VENV=.venv-60 DJANGO=6.0 scripts/venv.sh     Django 6.0 (the default is the newest Django 6)
#   VENV=.venv-312 PYTHON=python3.12 scripts/venv.sh   another Python (3.12+)
#   WITH_MYSQL=1 scripts/venv.sh    also mysqlclient (needs the MariaDB/MySQL client headers)
#   WITH_BENCH=1 scripts/venv.sh    also the benchmark's peers (the bench group; Django 6 only)
#   WITH_DOCS=1 scripts/venv.sh     also mkdocs, to build the documentation
#   WITH_RELEASE=1 scripts/venv.sh  also build and twine (scripts/wheel_check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
DJANGO=${DJANGO:-6}

find_python() {
    # Django 6 needs Python 3.12+; the backport runs on 3.10+.
    local minimum=$1 candidate
    local candidates=("${PYTHON:-}" python3.13 python3.12 python3)
    if command -v pyenv >/dev/null 2>&1; then
        candidates+=("$(pyenv root)"/versions/3.13*/bin/python3 "$(pyenv root)"/versions/3.12*/bin/python3)
    fi
    for candidate in "${candidates[@]}"; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c "import sys; sys.exit(sys.version_info < ($minimum))" 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "No Python >= ${minimum/, /.} found; set PYTHON=/path/to/python3" >&2
    return 1
}

if [ "$DJANGO" = "5.2" ]; then
    python=$(find_python "3, 10")
    extras="compat,postgres"
else
    python=$(find_python "3, 12") || {
        echo "Django 6 needs Python 3.12 or newer. For Django 5.2 with the django-tasks backport" \
            "(Python 3.10+): VENV=.venv-52 DJANGO=5.2 scripts/venv.sh" >&2
        exit 1
    }
    extras="postgres"
fi
[ "${WITH_MYSQL:-0}" = "1" ] && extras="$extras,mysql"
[ "${WITH_BENCH:-0}" = "1" ] && extras="$extras,mysql"
extras="$extras,metrics"

# "uv --version", not "command -v uv": a pyenv shim is on PATH even where the active Python
# has no uv, and then fails when run.
if uv --version >/dev/null 2>&1; then
    uv=$(command -v uv)
    $uv venv --quiet --allow-existing --python "$python" "$VENV"
else
    # No uv on PATH: bootstrap it inside the environment once, never into the interpreter
    # running this script (that printed pip's warning about root on every run). The
    # environment is made without pip (ensurepip took 2 of a fresh clone's 7 s here; uv adds
    # it below): the interpreter's pip installs uv into it (pip >= 22.3's --python); an older
    # pip, or none, falls back to a pip inside the environment.
    [ -x "$VENV/bin/python" ] || "$python" -m venv --without-pip "$VENV"
    if [ ! -x "$VENV/bin/uv" ]; then
        "$python" -m pip --python "$VENV/bin/python" install --quiet --disable-pip-version-check uv 2>/dev/null || {
            "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip >/dev/null
            "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv
        }
    fi
    uv="$VENV/bin/uv"
fi
groups="--group test --group lint"
[ "${WITH_DOCS:-0}" = "1" ] && groups="$groups --group docs"
[ "${WITH_BENCH:-0}" = "1" ] && groups="$groups --group bench"
[ "${WITH_RELEASE:-0}" = "1" ] && groups="$groups --group release"
# pip too, so `.venv/bin/pip install X` works as in any virtual environment (and `make
# django-contract`, which downloads Django's source with pip download); uv installs it from its
# cache in about a second, where ensurepip took two.
# shellcheck disable=SC2086
$uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" -e ".[$extras]" pip $groups
case "$DJANGO" in
    5.2) $uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" "django>=5.2,<6.0" ;;
    6.0) $uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" "django>=6.0,<6.1" ;;
esac
echo "$VENV ready: $("$VENV/bin/python" -c 'import django, sys; print(f"Python {sys.version.split()[0]}, Django {django.get_version()}")')"
