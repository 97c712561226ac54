#!/usr/bin/env bash
# Build the documentation site into site/, offline and strict (broken links, unknown API names and every warning
# fail): the guides in docs/, the API reference from the docstrings of prunetrain.__all__ (mkdocstrings) and the
# command-line reference generated from the typer app (docs/hooks/cli_reference.py). Needs the docs extra in .venv:
#   .venv/bin/pip install -e '.[docs]'
set -euo pipefail
cd "$(dirname "$0")/.."
python=".venv/bin/python"
[ -x "$python" ] || python="python3"
"$python" -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || {
  echo "scripts/docs.sh: the docs extra is not installed; run: $python -m pip install -e '.[docs]'" >&2; exit 2; }
# no network: no analytics, fonts or social cards are fetched (mkdocs.yml), and Hugging Face stays offline
export HF_HUB_OFFLINE=1 NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
"$python" -m mkdocs build --strict --clean --site-dir site "$@"
echo "site/index.html: the documentation (open it in a browser, or: $python -m mkdocs serve)"
