#!/usr/bin/env bash
# Run by the device tool on a lent GPU machine, one phase a call, back to back while the machine stays warm (it keeps
# /tmp between calls): `bash tools/gpu/phase.sh 1`, then 2, then 3. tools/gpu/prepare.sh builds what each phase
# carries (.gpu/p1, .gpu/p2, .gpu/p3); docs/gpu.md has the commands and what each phase measures.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?phase 1, 2 or 3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SITE=/tmp/specviz-site
PARTS=/tmp/specviz-parts
RESULTS=${OUT:-/tmp/specviz-gpu}/p$phase
mkdir -p "$PARTS" "$RESULTS"

cp .gpu/p"$phase"/target.* "$PARTS"/ 2>/dev/null
if [ ! -f "$SITE"/.wheels ] && [ -d .gpu/p1/wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu/p1/wheels/*.whl \
    && touch "$SITE"/.wheels
fi
export PYTHONPATH=$SITE
if [ ! -f "$SITE"/.target ] && [ -f "$PARTS"/target.part1 ] && [ -f "$PARTS"/target.part2 ]; then
  wheel=$(awk '{print $2}' "$PARTS"/target.sha256)
  cat "$PARTS"/target.part1 "$PARTS"/target.part2 > "$PARTS/$wheel"
  (cd "$PARTS" && sha256sum -c --quiet target.sha256) \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$PARTS/$wheel" \
    && touch "$SITE"/.target
fi
mkdir -p specviz/assets/models
for folder in .gpu/p"$phase"/models/*; do [ -d "$folder" ] && cp -r "$folder" specviz/assets/models/; done

{ nvidia-smi -L; python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__,
  torch.version.cuda, transformers.__version__, torch.cuda.get_device_name())"; ls "$SITE"; } 2>&1 | tee "$RESULTS"/env.txt

check() { timeout 560 python3 tools/gpu/check.py --out "$RESULTS" "$@" 2>&1 | tee "$RESULTS"/log.txt; }
case $phase in
  1) check --steps tests,verify_cost --workers 8 --shape-config .gpu/p1/config.json --budget-s 420 ;;
  2) check --steps speedup,near_ties --drafters hybrid,eagle3,medusa,ngram --budget-s 420 ;;
  3) check --steps speedup --drafters mtp,dflash,dspark --budget-s 420 ;;
  *) echo "phase 1, 2 or 3"; exit 2 ;;
esac
cat "$RESULTS"/gpu-check.md 2>/dev/null
