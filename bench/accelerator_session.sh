#!/usr/bin/env bash
# The accelerator measurements of BUILD_NOTES.md section 8.10, as one command on a GPU
# machine that has JAX, torch and transformers but neither TensorFlow nor Keras: Keras
# 3.15.1, keras-hub 0.32.0, namex and optree travel as Python 3.12 wheels in .whl/
# (gitignored; the device call carries it), fetched with
#
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 optree==0.20.0
#
#   bash bench/accelerator_session.sh PART DEADLINE_S    (results under $OUT, a log on stdout)
#
# SIZE=tiny LARGE=tiny runs the same steps at the tiny size (a dry run on a CPU: with
# python3 the project's virtualenv, and TensorFlow hidden as the GPU machine lacks it, e.g.
# by the sitecustomize.py of tests/conftest.py's without_tensorflow_env).
#
# PART 1: what the targets need in one call, most important first. Pretraining at base
#         (issue 46): ours, torch under torch.compile, ours with the three unmeasured
#         kernels that the step compiled for an H200 says move the fewest bytes
#         (position_one_hot, gelu_16_bits, dense_bias_16_bits; bench/compile_for_gpu.py,
#         BUILD_NOTES 8.10), keras-hub, the same three kernels at attention dropout 0.
#         Inference at base (issue 48): ours, ours with gelu_16_bits and
#         residual_layer_norm, the same on the real tokens only, torch_compile. Ours'
#         compiled pretraining step comes back as gzipped HLO text, and its traces as
#         .xplane.pb.
# PART 2: the rest: BERT-large ours and torch_compile; the three pretraining kernels each
#         left out in turn (which of them wins); the inference A/Bs against ours in the same
#         run (the two kernels alone, the real tokens alone, the mask always, without the
#         per-layer key-lengths conditional: BUILD_NOTES 8.12); fine-tuning (ours, ours with
#         dense_bias_16_bits and gelu_16_bits, torch_compile); the inference peers measured
#         once already (torch eager, keras-hub).
# PART attention: the attention A/B (bench/bench_attention_kernels.py at base size).
# Each part launches nothing after DEADLINE_S seconds (bench_accelerator's --deadline_s).
set -uo pipefail
PART=${1:-1}
DEADLINE=${2:-420}
case "$PART" in 1|2|attention) ;; *)
  echo "error: bench/accelerator_session.sh: unknown PART '$PART'; expected 1, 2 or attention" >&2
  exit 2 ;;
esac
if ! [[ "$DEADLINE" =~ ^[0-9]+$ ]] || (( 10#$DEADLINE < 1 )); then
  echo "error: bench/accelerator_session.sh: DEADLINE_S must be a positive number of seconds, got '$DEADLINE'" >&2
  exit 2
fi
DEADLINE=$((10#$DEADLINE))
OUT=${OUT:-/tmp/accelerator}
S=${SIZE:-base}
L=${LARGE:-large}
# The pretraining kernels part 1 measures together (part 2 leaves each out in turn).
K=position_one_hot+gelu_16_bits+dense_bias_16_bits
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((DEADLINE - $(date +%s) + START)); }
# PERCENT% of the seconds left, at least 1: bench_accelerator reads --deadline_s=0 as "no
# limit", and under 30 s it launches nothing.
share() { local s=$(( $(left) * $1 / 100 )); echo $(( s < 1 ? 1 : s )); }

# The backend first: Keras' default (tensorflow) fails to import where TensorFlow is absent,
# and the wheels would be installed over a Keras that is there.
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
if ! python3 -c "import keras, keras_hub" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total \
  --format=csv
python3 -c "import jax, keras, torch, transformers; print('jax', jax.__version__, \
'keras', keras.__version__, 'torch', torch.__version__, 'transformers', \
transformers.__version__, jax.devices())"

case "$PART" in
1)
  python3 bench/bench_accelerator.py \
    --order="$S:ours,$S:torch_compile,$S:ours@enable=$K,$S:keras_hub,$S:ours@attention_dropout=0;enable=$K" \
    --steps=5 --rounds=4 --warmup_steps=2 --deadline_s="$(share 62)" \
    --out="$OUT" --profile_dir=/tmp/profiles --hlo_dir=/tmp/hlo
  python3 bench/bench_accelerator.py --mode=inference \
    --order="$S:ours,$S:ours@enable=gelu_16_bits+residual_layer_norm,$S:ours@real_tokens=1024;enable=gelu_16_bits+residual_layer_norm,$S:torch_compile" \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(share 100)" --out="$OUT/inference" \
    --profile_dir=/tmp/profiles/inf
  cp /tmp/hlo/ours_"$S".hlo.txt.gz /tmp/profiles/ours_"$S".xplane.pb "$OUT/" 2>/dev/null
  cp /tmp/profiles/inf/ours_"$S".xplane.pb "$OUT/inference/" 2>/dev/null
  ;;
2)
  python3 bench/bench_accelerator.py --order=$L:ours,$L:torch_compile --steps=5 --rounds=4 \
    --warmup_steps=2 --deadline_s="$(share 35)" --out="$OUT/large"
  python3 bench/bench_accelerator.py --mode=inference \
    --order="$S:ours,$S:ours@enable=gelu_16_bits+residual_layer_norm,$S:ours@real_tokens=1024,$S:ours@disable=cudnn_key_lengths" \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(share 30)" \
    --out="$OUT/inference_ab"
  python3 bench/bench_accelerator.py \
    --order=$S:ours@enable=gelu_16_bits+dense_bias_16_bits,$S:ours@enable=position_one_hot+dense_bias_16_bits,$S:ours@enable=position_one_hot+gelu_16_bits \
    --steps=5 --rounds=4 --warmup_steps=2 --deadline_s="$(share 45)" --out="$OUT/leave_one_out"
  python3 bench/bench_accelerator.py --mode=finetune \
    --order=$S:ours,$S:ours@enable=dense_bias_16_bits+gelu_16_bits,$S:torch_compile \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(share 60)" --out="$OUT/finetune"
  python3 bench/bench_accelerator.py --mode=inference --order=$S:torch,$S:keras_hub \
    --steps=10 --rounds=4 --warmup_steps=2 --deadline_s="$(share 100)" \
    --out="$OUT/inference_peers"
  ;;
attention)
  timeout 150 python3 bench/bench_attention_kernels.py --size="$S" --repeats=10 --out="$OUT"
  ;;
esac
# Ours' traces come back (the others' breakdowns are in the results); the tables are in the
# log, so only results.json stays (at most 8 files come back from the machine).
rm -f "$OUT"/results.md "$OUT"/*/results.md
echo "# part $PART done in $(( $(date +%s) - START )) s"
