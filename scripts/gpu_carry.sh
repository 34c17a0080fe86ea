#!/usr/bin/env bash
# Builds the folder that carries bench/gpu_v2_check.py to a device machine (docs/constraints.md,
# "Model Runner V2 on an NVIDIA GPU"): a machine with torch, Triton and numpy but no vLLM and
# no network. What travels (well under the 64 MiB carry limit):
#   site/   Podium's src/podium; the pure-Python vLLM 0.32 modules the check imports (no .so:
#           vLLM's CUDA build cannot travel), plus a stub for vllm._C_stable_libtorch (see
#           below); dist-info for vllm (so its platform check sees a non-CPU build) and podium
#           (its vllm.logits_processors entry point, which V2's loader reads)
#   wt/     bench/gpu_v2_check.py and the tests/support helpers it uses
#   model/  the default model's tokenizer files (no weights)
#   whl/    cp312 manylinux wheels of the pure-Python and compiled dependencies the device's
#           image lacks (pydantic, msgspec, pyzmq, ...), installed there with pip --no-index
#
# usage: scripts/gpu_carry.sh [DEST]   (default: <checkout the session runs in>/.gpu)
# DEST must be a git-ignored folder of the checkout the device receives; this script adds
# "/.gpu/" to that checkout's .git/info/exclude when DEST is its .gpu.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
main=${PODIUM_DEVICE_CHECKOUT:-/work/main}
dest=${1:-$main/.gpu}
py=${PYTHON:-$main/.venv/bin/python}
site=$("$py" -c 'import vllm, os; print(os.path.dirname(os.path.dirname(vllm.__file__)))')
if [ "$dest" = "$main/.gpu" ]; then
  exclude=$(git -C "$main" rev-parse --git-path info/exclude)
  case "$exclude" in /*) ;; *) exclude="$main/$exclude" ;; esac
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
fi
rm -rf "$dest"
mkdir -p "$dest"/{site,wt/bench,wt/tests/support,model,whl}

# Podium and the check
cp -r "$here/src/podium" "$dest/site/" && find "$dest/site/podium" -name __pycache__ -prune -exec rm -rf {} +
cp "$here/bench/__init__.py" "$here/bench/gpu_v2_check.py" "$dest/wt/bench/"
touch "$dest/wt/tests/__init__.py"
for f in __init__ catalog walk constraint_sim; do cp "$here/tests/support/$f.py" "$dest/wt/tests/support/"; done
mkdir -p "$dest/site/podium-0.1.0.dist-info" "$dest/site/vllm-0.32.0.dist-info"
printf 'Metadata-Version: 2.1\nName: podium\nVersion: 0.1.0\n' >"$dest/site/podium-0.1.0.dist-info/METADATA"
sed -n '/^\[project.entry-points."vllm.logits_processors"\]/,/^$/p' "$here/pyproject.toml" \
  | sed 's/^\[project.entry-points."\(.*\)"\]/[\1]/; s/"//g' >"$dest/site/podium-0.1.0.dist-info/entry_points.txt"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n' >"$dest/site/vllm-0.32.0.dist-info/METADATA"

# vLLM: every module the check imports (its CPU dry run, plus the CUDA platform module),
# and whole the packages on the CUDA path that the CPU run cannot reach
PYTHONPATH="$here/src:$here" HF_HUB_OFFLINE=1 "$py" - "$site" "$dest/site" <<'EOF'
import os, shutil, sys, types
site, out = sys.argv[1], sys.argv[2]
import bench.gpu_v2_check as g
g._cpu_triton()
import tests.support.constraint_sim  # noqa: F401  (vllm.SamplingParams, the V2 objects)
import vllm.utils.torch_utils, vllm.v1.worker.gpu.input_batch, vllm.v1.worker.gpu.states  # noqa
import vllm.v1.worker.cpu.buffer_utils, vllm.v1.sample.logits_processor  # noqa
import vllm.v1.worker.gpu.sample.logits_processor.loader as loader  # noqa
import podium.constraints.engine.processor, podium.constraints.engine.batch  # noqa
sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
import vllm.platforms.cuda  # noqa: F401
files = {m.__file__ for n, m in list(sys.modules.items())
         if n.startswith("vllm") and getattr(m, "__file__", None)}
whole = ["platforms", "utils", "third_party", "triton_utils", "v1/worker/gpu", "v1/sample",
         "config", "v1/attention", "logging_utils"]
for d in whole:
    for root, _dirs, names in os.walk(os.path.join(site, "vllm", d)):
        files.update(os.path.join(root, n) for n in names if n.endswith(".py"))
for f in sorted(files):
    if not f.endswith(".py"):
        continue
    rel = os.path.relpath(f, site)
    os.makedirs(os.path.join(out, os.path.dirname(rel)), exist_ok=True)
    shutil.copyfile(f, os.path.join(out, rel))
# every package on the way needs its __init__.py
for root, _dirs, _names in os.walk(os.path.join(out, "vllm")):
    init = os.path.join(root, "__init__.py")
    src = os.path.join(site, os.path.relpath(init, out))
    if not os.path.exists(init) and os.path.exists(src):
        shutil.copyfile(src, init)
print(len(files), "vllm files")
EOF
# vllm.platforms.cuda imports this compiled extension only to register custom ops; the check
# calls one of them (get_cuda_view_from_cpu_tensor), which gpu_v2_check.py supplies in Python
cat >"$dest/site/vllm/_C_stable_libtorch.py" <<'EOF'
"""Stub: vLLM's compiled extension cannot travel; see bench/gpu_v2_check.py (_cuda_view_op)."""
EOF

# the tokenizer (no weights)
model=$(PYTHONPATH="$here/src" "$py" -c 'from podium.package.defaults import default_model_dir as d; print(d())')
for f in tokenizer.json tokenizer_config.json config.json generation_config.json chat_template.jinja; do
  [ -f "$model/$f" ] && cp "$model/$f" "$dest/model/"
done

# what the device image lacks, as cp312 wheels (pip download needs the network here)
if [ -z "${SKIP_WHEELS:-}" ]; then
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dest/whl" $(sed 's/#.*//' "$here/scripts/gpu_carry_wheels.txt")
fi
du -sh "$dest"
