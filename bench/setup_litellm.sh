#!/bin/sh
# Installs LiteLLM's proxy into its own venv (bench/.litellm-venv) so bench/run.py can add it as
# a comparison column. Kept apart from the project venv: litellm pins many dependencies.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.litellm-venv"
python=${PYTHON:-python3}
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q 'litellm[proxy]'
"$venv/bin/litellm" --version
echo "installed: $venv (bench/run.py picks it up automatically)"
