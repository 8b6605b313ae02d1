#!/usr/bin/env bash
# Break a behaviour on purpose and check that the fast suite (make test-fast) catches it. Each
# mutation is applied alone, to a scratch worktree of the committed tree (never to this one):
#
#   rescue    Dialect.requeue_orphans does nothing: a dead worker's tasks are never rescued
#   retry     a retried attempt calls the task's function twice
#   handoff   a workflow step's outcome is stored without moving its workflow on
#
#   scripts/mutations.sh                  all three, on SQLite
#   scripts/mutations.sh retry handoff    some of them
#   DATABASE_URL=postgres://... scripts/mutations.sh
#   PYTEST_ARGS="-x" scripts/mutations.sh      stop each run at its first failure
#
# Prints the tests that failed under each mutation; exits 1 if the fast suite passed under one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python="$root/${VENV:-.venv}/bin/python"
[ $# -gt 0 ] || set -- rescue retry handoff
# The selection of make test-fast (Makefile: FAST_MARKERS).
fast_markers="not worker_process and not load"

scratch=$(mktemp -d)
cleanup() {
    git -C "$root" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT

mutate() {  # mutate NAME: apply one mutation to the scratch tree; fail if its code has moved
    (cd "$scratch/tree" && "$python" - "$1") <<'EOF'
import sys
from pathlib import Path

MUTATIONS = {
    "rescue": [(
        "django_sqltasks/sql/outcomes.py",
        "        cursor.execute(\n            *self.requeue_orphans_sql(",
        "        return 0  # mutation: no rescue\n"
        "        cursor.execute(\n            *self.requeue_orphans_sql(",
    )],
    "retry": [(
        "django_sqltasks/worker/executor.py",
        "                    returned = attempt.task.func(*args, **kwargs)\n                else:",
        "                    returned = attempt.task.func(*args, **kwargs)\n"
        "                    if attempt.row.attempts > 1:  # mutation: a retry runs twice\n"
        "                        returned = attempt.task.func(*args, **kwargs)\n"
        "                else:",
    ), (
        "django_sqltasks/worker/attempt.py",
        "            return await self.task.func(*args, **kwargs)\n",
        "            if self.row.attempts > 1:  # mutation: a retry runs twice\n"
        "                await self.task.func(*args, **kwargs)\n"
        "            return await self.task.func(*args, **kwargs)\n",
    )],
    "handoff": [(
        "django_sqltasks/store/workflows.py",
        "        advance(database, [o for o in outcomes if o.id in written and _ends_step(o)])",
        "        pass  # mutation: the workflow is not moved on",
    )],
}
for path, old, new in MUTATIONS[sys.argv[1]]:
    text = Path(path).read_text()
    if text.count(old) != 1:
        sys.exit(f"mutation {sys.argv[1]}: the code it changes is no longer in {path}; update "
                 "scripts/mutations.sh")
    Path(path).write_text(text.replace(old, new))
EOF
}

survived=()
for name in "$@"; do
    git -C "$root" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true
    git -C "$root" worktree add --detach --quiet "$scratch/tree" HEAD
    mutate "$name"
    echo "=== mutation $name:"
    git -C "$scratch/tree" diff --stat | sed 's/^/    /'
    log="$scratch/$name.log"
    # From the scratch tree: its django_sqltasks comes first on sys.path, and worker processes
    # run from it too (tests/conftest.py ROOT).
    (cd "$scratch/tree" && SQLTASKS_SQLITE_PATH="$scratch/$name.sqlite3" "$python" -m pytest \
        -n "${XDIST:-auto}" -p no:randomly -q -rf -m "$fast_markers" --ignore=tests/admin/browser \
        ${PYTEST_ARGS:-} >"$log" 2>&1) && status=0 || status=$?
    if [ "$status" -eq 0 ]; then
        survived+=("$name")
        echo "    SURVIVED: the fast suite passed ($(tail -1 "$log"))"
    else
        echo "    caught: $(tail -1 "$log")"
        grep -E '^(FAILED|ERROR) ' "$log" | sed -e 's/ - .*//' -e 's/^/    /' || tail -20 "$log"
    fi
done
if [ ${#survived[@]} -gt 0 ]; then
    echo "The fast suite missed: ${survived[*]}"
    exit 1
fi
