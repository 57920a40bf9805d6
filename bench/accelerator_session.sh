#!/usr/bin/env bash
# The accelerator measurements of BUILD_NOTES.md section 8.10, as one command on a GPU
# machine that has JAX, torch and transformers but neither TensorFlow nor Keras: Keras
# 3.15.1, keras-hub 0.32.0, namex and optree travel as Python 3.12 wheels in .whl/ (fetch
# them with `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`).
#
#   bash bench/accelerator_session.sh PART DEADLINE_S    (results under $OUT, a log on stdout)
#
# SIZE=tiny LARGE=tiny runs the same steps at the tiny size (a dry run on a CPU).
#
# PART 1: the attention A/B (bench/bench_attention_kernels.py at base size), then the
#         pretraining sides, most important first; the Pallas kernel's tiles are the A/B's
#         fastest at BERT's rate (BERT_KERAS_FLASH_ATTENTION_CONFIG), printed.
# PART 2: the pretraining sides again (after part 1's findings), then fine-tuning and
#         inference (issue 48); ours' compiled step comes back as gzipped HLO text.
# Each part launches nothing after DEADLINE_S seconds (bench_accelerator's --deadline_s).
set -uo pipefail
PART=${1:-1}
DEADLINE=${2:-420}
OUT=${OUT:-/tmp/accelerator}
S=${SIZE:-base}
L=${LARGE:-large}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((DEADLINE - $(date +%s) + START)); }

if ! python3 -c "import keras" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total \
  --format=csv
python3 -c "import jax, keras, torch, transformers; print('jax', jax.__version__, \
'keras', keras.__version__, 'torch', torch.__version__, 'transformers', \
transformers.__version__, jax.devices())"

case "$PART" in
1)
  timeout 150 python3 bench/bench_attention_kernels.py --size="$S" --repeats=10 --out="$OUT"
  BEST=$(python3 - "$OUT/attention_$S.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from bench_attention_kernels import FLASH_CONFIGS
rows = json.load(open(sys.argv[1]))["rows"]
timed = [r for r in rows if r["path"] in FLASH_CONFIGS and r["rate"] == 0.1 and "ms" in r
         and (r.get("max_relative_error") or 1) < 2e-2]
print(json.dumps(FLASH_CONFIGS[min(timed, key=lambda r: r["ms"])["path"]]) if timed else "{}")
EOF
)
  echo "# Pallas tiles for the pretraining sides: ${BEST:-{\}}"
  export BERT_KERAS_FLASH_ATTENTION_CONFIG="${BEST:-{\}}"
  python3 bench/bench_accelerator.py \
    --order=$S:ours,$S:torch_compile,$S:ours@attention_dropout=0,$S:keras_hub,$L:ours,$L:torch_compile \
    --steps=6 --rounds=4 --warmup_steps=3 --deadline_s="$(left)" --out="$OUT" \
    --profile_dir=/tmp/profiles
  ;;
2)
  # Pretraining first (issue 46), then fine-tuning and inference (issue 48).
  python3 bench/bench_accelerator.py \
    --order=$S:ours,$S:torch_compile,$S:ours@attention_dropout=0,$S:keras_hub,$L:ours,$L:torch_compile \
    --steps=5 --rounds=4 --warmup_steps=2 --deadline_s="$(( $(left) - 110 ))" --out="$OUT" \
    --profile_dir=/tmp/profiles --hlo_dir=/tmp/hlo
  python3 bench/bench_accelerator.py --mode=finetune --order=$S:ours,$S:torch_compile \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(( $(left) - 50 ))" \
    --out="$OUT/finetune"
  python3 bench/bench_accelerator.py --mode=inference --order=$S:ours,$S:torch_compile \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(left)" --out="$OUT/inference"
  cp /tmp/hlo/ours_"$S".hlo.txt.gz "$OUT/" 2>/dev/null
  ;;
esac
# Ours' trace comes back (the others' breakdowns are in the results); the tables are in the
# log, so only results.json stays (at most 8 files come back from the machine).
cp /tmp/profiles/ours_"$S".xplane.pb "$OUT/" 2>/dev/null
rm -f "$OUT"/results.md "$OUT"/*/results.md
echo "# part $PART done in $(( $(date +%s) - START )) s"
