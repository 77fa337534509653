#!/usr/bin/env bash
# Run `ansible-test sanity` on a copy of the collection.
#
# ansible-test needs the collection at .../ansible_collections/<namespace>/<name> inside a git
# work tree, and it bootstraps pip with a script it downloads from a host that offline and
# registry-only machines cannot reach. This script copies the tracked and untracked-not-ignored
# files into .build/sanity/ansible_collections/gpufleet/nvidia, makes that a git work tree, puts a
# stand-in for the pip bootstrap script into ansible-test's cache (it uses ensurepip and the
# configured package index instead), and runs every sanity test with ansible-test's own pinned
# requirements in a virtualenv of its own (.venv-sanity), so the test tools' pins never touch
# the main virtualenv.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
venv="$repo/.venv-sanity"
work="$repo/.build/sanity/ansible_collections/gpufleet/nvidia"

if [ ! -x "$venv/bin/ansible-test" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "$(grep '^ansible-core==' "$repo/requirements-test.txt")"
fi

cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
for name in get_pip_24_2.py get_pip_25_0_1.py get_pip_25_2.py; do
  cat > "$cache/$name" <<'PY'
"""Stand-in for pip's bootstrap script: ensurepip, then pip install <arguments>."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel", "--disable-pip-version-check")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + args)
PY
done

rm -rf "$work"
mkdir -p "$work"
cd "$repo"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] || continue
  mkdir -p "$work/$(dirname "$f")"
  cp -p "$f" "$work/$f"
done
cd "$work"
git init -q
git add -A
git -c user.email=sanity@localhost -c user.name=sanity commit -qm sanity
"$venv/bin/ansible-test" sanity --local --python "$pyver" --requirements --color no "$@"
