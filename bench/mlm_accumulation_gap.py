"""How far run_pretraining's accumulated update is from one batch of k x b (BUILD_NOTES 8.14).

Google's masked-LM loss is a ratio per batch, sum(w x CE) / (sum(w) + 1e-5) over its masked
positions (`bert_keras.losses.MaskedLMLoss`), and `--gradient_accumulation_steps=k` averages
the gradients of k micro-batches of b sequences (Keras' optimizer; NVIDIA's BERT scripts
accumulate the same way). Where the micro-batches hold different numbers of real masked
positions, each position weighs 1 / (k x its micro-batch's count) instead of 1 / (the
update's count). This measures the resulting gradient against the big batch's, on a tiny
pretrainer (dropout 0, random tokens), for three distributions of masks per sequence:

  equal     every sequence 12 masks: the control (float32 noise only)
  google    Google's recipe at S128/P20: 90% full sequences (18-19 masks), 10% short ones
            (short_seq_prob 0.1) with round(0.15 x length) masks
  uniform   1-20 masks, evenly spread

Reported per (distribution, b, loss): the relative L2 error ||g_acc - g_big|| / ||g_big||
of all trainable variables' gradients, mean and max over --trials updates. One JSON line.

    python bench/mlm_accumulation_gap.py [--micro_batches=4] [--sizes=4,16,64] [--trials=5]
"""

import argparse
import json

import keras
import numpy as np
import tensorflow as tf

from bert_keras import BertEncoder
from bert_keras.losses import MaskedLMLoss, nsp_loss
from bert_keras.pretrainer import BertPretrainer

V, S, P = 99, 32, 20  # vocabulary, sequence length, max_predictions_per_seq
COUNTS = {
    "equal": lambda rng, n: np.full(n, 12),
    "google": lambda rng, n: np.array([
        min(P, max(1, round(0.15 * (rng.integers(5, 126) if rng.random() < 0.1
                                     else rng.integers(118, 129))))) for _ in range(n)]),
    "uniform": lambda rng, n: rng.integers(1, P + 1, n),
}


def batch(rng, counts):
    """Pretraining inputs of len(counts) sequences, sequence i with counts[i] real masks."""
    n = len(counts)
    positions = np.zeros((n, P), np.int32)
    labels = np.zeros((n, P), np.int32)
    weights = np.zeros((n, P), np.float32)
    for i, count in enumerate(counts):
        positions[i, :count] = np.sort(rng.choice(np.arange(1, S - 1), count, replace=False))
        labels[i, :count] = rng.integers(1, V, count)
        weights[i, :count] = 1.0
    x = {"input_word_ids": rng.integers(1, V, (n, S)).astype(np.int32),
         "input_mask": np.ones((n, S), np.int32), "input_type_ids": np.zeros((n, S), np.int32),
         "masked_lm_positions": positions}
    return x, labels, weights, rng.integers(0, 2, n).astype(np.int32)


def gradient(model, rows, x, labels, weights, nsp_labels, with_nsp):
    """The flattened gradient of the pretraining loss on rows `rows` of the inputs."""
    with tf.GradientTape() as tape:
        out = model({k: v[rows] for k, v in x.items()}, training=True)
        loss = MaskedLMLoss()(labels[rows], out["mlm_logits"], weights[rows])
        if with_nsp:
            loss = loss + nsp_loss()(nsp_labels[rows], out["nsp_logits"])
    grads = tape.gradient(loss, model.trainable_variables)
    return np.concatenate([tf.convert_to_tensor(g).numpy().ravel() for g in grads
                           if g is not None])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro_batches", type=int, default=4, help="k")
    parser.add_argument("--sizes", default="4,16,64", help="micro-batch sizes b")
    parser.add_argument("--trials", type=int, default=5, help="updates per row")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    model = BertPretrainer(BertEncoder(
        vocab_size=V, num_layers=2, hidden_size=32, num_heads=4, intermediate_size=37,
        max_sequence_length=S, dropout=0.0, attention_dropout=0.0))
    k, rows = args.micro_batches, []
    for name, counts_of in COUNTS.items():
        for b in (int(s) for s in args.sizes.split(",")):
            for with_nsp in (False, True):
                rng, errors = np.random.default_rng(1), []
                for _ in range(args.trials):
                    data = batch(rng, counts_of(rng, b * k))
                    big = gradient(model, slice(0, b * k), *data, with_nsp)
                    accumulated = np.mean([gradient(model, slice(i * b, (i + 1) * b), *data,
                                                    with_nsp) for i in range(k)], axis=0)
                    errors.append(float(np.linalg.norm(accumulated - big) / np.linalg.norm(big)))
                rows.append({"counts": name, "b": b, "k": k,
                             "loss": "mlm+nsp" if with_nsp else "mlm",
                             "mean": float(np.mean(errors)), "max": float(np.max(errors))})
                print(f"{name:8s} b={b:3d} k={k} {rows[-1]['loss']:8s} relative gradient "
                      f"error mean {rows[-1]['mean']:.2e} max {rows[-1]['max']:.2e}", flush=True)
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
