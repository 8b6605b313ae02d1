#!/usr/bin/env bash
# What a release ships, checked as a user meets it: build the sdist and the wheel (the wheel from
# the sdist, as `python -m build` does), check their metadata (twine check) and contents
# (scripts/dist_check.py: templates, migrations, py.typed, every file of the package), install the
# wheel, not the checkout, into a fresh virtual environment, and run the example project against
# it on SQLite and on PostgreSQL: migrate, the demo (enqueue, a worker, outcomes), a worker
# process, tasks_status, the admin's pages and the example's own tests.
#
#   scripts/wheel_check.sh                  SQLite, then PostgreSQL at $PG_URL
#   PG_URL= scripts/wheel_check.sh          SQLite only
#   DIST=dist scripts/wheel_check.sh        keep the built files in dist/ (the release workflow)
#
# PG_URL's database is dropped and created again, so that migrate starts from nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
VENV=${VENV:-.venv}
PG_URL=${PG_URL-postgres://postgres@127.0.0.1:5432/sqltasks_wheel}
SECONDS=0
step() { printf '\n--- %s (%ss)\n' "$*" "$SECONDS"; }

WITH_RELEASE=1 VENV=$VENV scripts/venv.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dist=${DIST:-$work/dist}
rm -rf "$dist"

step "Build the sdist and the wheel"
"$VENV/bin/python" -m build --outdir "$dist" . >"$work/build.log" 2>&1 || {
    cat "$work/build.log"
    exit 1
}
version=$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
wheel=$(cd "$dist" && pwd)/django_sqltasks-$version-py3-none-any.whl
ls -l "$dist"

step "Check their metadata and contents"
"$VENV/bin/twine" check --strict "$dist"/*
"$VENV/bin/python" scripts/dist_check.py "$dist"

step "Install the wheel into a fresh virtual environment"
if uv --version >/dev/null 2>&1; then uv=$(command -v uv); else uv=$root/$VENV/bin/uv; fi
python=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')
"$uv" venv --quiet --python "$python" "$work/venv"
py=$work/venv/bin/python
"$uv" pip install --quiet --python "$py" "django-sqltasks[postgres] @ file://$wheel" dj-database-url
# The example project, without the checkout beside it: nothing but the wheel provides the package.
mkdir "$work/example"
cp -r example_project/manage.py example_project/example_project example_project/shop "$work/example/"
cd "$work/example"
"$py" - <<'EOF'
import django_sqltasks, sys
where = django_sqltasks.__file__
assert "site-packages" in where, f"django_sqltasks imported from {where}, not the installed wheel"
print(f"django_sqltasks {django_sqltasks.__version__} from {where}")
EOF

run_example() {
    "$py" manage.py check --fail-level WARNING
    "$py" manage.py demo
    "$py" manage.py shell -c "from shop.tasks import send_order_confirmation as t; print(t.enqueue(order_id=9, email='a@example.com').id)"
    "$py" manage.py tasks_worker --burst --queue '*'
    "$py" manage.py tasks_status
    "$py" manage.py shell <<'EOF'
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

user, _ = User.objects.get_or_create(username="wheel-check", is_staff=True, is_superuser=True)
client = Client()
client.force_login(user)
for page in ("queueoverview", "taskrecord", "workerrecord", "schedulerecord", "tasklimit"):
    url = reverse(f"admin:django_sqltasks_{page}_changelist")
    response = client.get(url)
    assert response.status_code == 200, f"{url}: {response.status_code}"
print("admin pages: 200")
EOF
    "$py" manage.py test shop -v 1
}

step "The example project on SQLite"
run_example

if [ -n "$PG_URL" ]; then
    step "The example project on PostgreSQL"
    "$py" - "$PG_URL" <<'EOF'
import sys

import dj_database_url
import psycopg

settings = dj_database_url.parse(sys.argv[1])
name = settings["NAME"]
with psycopg.connect(
    host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
    password=settings["PASSWORD"] or None, dbname="postgres", autocommit=True,
) as connection:
    connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
    connection.execute(f'CREATE DATABASE "{name}"')
EOF
    DATABASE_URL=$PG_URL run_example
fi

step "The wheel works: $(basename "$wheel")"
