#!/usr/bin/env bash
# The Python package as a user gets it: `pip install .` into a fresh virtual environment (build
# isolation: scikit-build-core and nanobind come from PyPI; the library builds from these sources,
# CPU-only unless nvcc is found), `import veloxquant` from outside the checkout, then the package's
# tests against the installed copy. Rebuilds are incremental (build/pip).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$tmp/venv/bin/python" -m pip install -q "$root[test]"
cd "$tmp"
"$tmp/venv/bin/python" -c "import veloxquant, os; print('veloxquant', veloxquant.__version__, 'from', os.path.dirname(veloxquant.__file__))"
test -f "$("$tmp/venv/bin/python" -c 'import veloxquant, os; print(os.path.dirname(veloxquant.__file__))')/_veloxquant.pyi"
# The distribution's version (read from CMakeLists.txt at build time) is the library's.
"$tmp/venv/bin/python" -c "import importlib.metadata as m, veloxquant as v; assert m.version('veloxquant') == v.__version__, (m.version('veloxquant'), v.__version__)"
"$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
