"""What the optimizer's arithmetic choices do to a small training run (issue 28/29 figures).

A tiny BERT (transformers' BertForPreTraining, MLM only, H=64, 2 layers, V=211) learns a
synthetic language: token sequences from a random sparse bigram chain (each token has 4
likely successors), so the masked-LM loss can fall well below log(V). The update is
written out in torch (the arithmetic `bert_keras/optimization.py` documents), and one
choice is changed at a time:

  ours          bias correction, epsilon in sqrt(v_hat) + eps (adam_paper), linear schedule
  eps=keras     epsilon outside the bias correction (Keras' Adam)
  google_sched  Google's TF1 schedule (decay from step 0)
  no_bias_corr  Google's AdamWeightDecayOptimizer: no bias correction (m / (sqrt(v) + eps))
  google_all    all of Google's: no bias correction, TF1 schedule

Reported: mean masked-LM loss over the last 20 updates, per seed, and mean over seeds.
It runs on CPU in about a minute; no TensorFlow involved.

    python bench/optimizer_arithmetic.py [--steps=300] [--seeds=0,1,2]
"""

import argparse
import json

import numpy as np
import torch
import transformers

V, H, LAYERS, S, B, P = 211, 64, 2, 32, 16, 5
VARIANTS = {
    "ours": dict(bias_correction=True, placement="adam_paper", schedule="linear"),
    "eps=keras": dict(bias_correction=True, placement="keras", schedule="linear"),
    "google_sched": dict(bias_correction=True, placement="adam_paper", schedule="google"),
    "no_bias_corr": dict(bias_correction=False, placement="adam_paper", schedule="linear"),
    "google_all": dict(bias_correction=False, placement="adam_paper", schedule="google"),
}


def make_batches(seed, steps):
    rng = np.random.default_rng(1000 + seed)
    successors = rng.integers(1, V, size=(V, 4))
    chain = rng.dirichlet(np.ones(4) * 0.5, size=V)
    batches = []
    for _ in range(steps):
        ids = np.zeros((B, S), np.int64)
        ids[:, 0] = rng.integers(1, V, size=B)
        for j in range(1, S):
            choice = np.array([rng.choice(4, p=chain[t]) for t in ids[:, j - 1]])
            ids[:, j] = successors[ids[:, j - 1], choice]
        positions = np.stack([np.sort(rng.choice(np.arange(1, S), P, replace=False))
                              for _ in range(B)])
        labels = np.take_along_axis(ids, positions, 1)
        inputs = ids.copy()
        np.put_along_axis(inputs, positions, 0, 1)  # [MASK] = 0
        batches.append((torch.from_numpy(inputs), torch.from_numpy(positions),
                        torch.from_numpy(labels)))
    return batches


def train(seed, batches, steps, bias_correction, placement, schedule, peak=1e-3,
          warmup_fraction=0.1, weight_decay=0.01, eps=1e-6, betas=(0.9, 0.999), clip=1.0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
        intermediate_size=4 * H, max_position_embeddings=S, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    model = transformers.BertForPreTraining(config)
    model.bert.embeddings.word_embeddings.padding_idx = None
    params = dict(model.named_parameters())
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    warmup = int(steps * warmup_fraction)
    losses = []
    for t, (inputs, positions, labels) in enumerate(batches[:steps], start=1):
        out = model(input_ids=inputs)
        logits = torch.gather(out.prediction_logits, 1, positions[..., None].expand(-1, -1, V))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        losses.append(loss.item())
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params.values(), grads)]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = torch.clamp(clip / norm, max=1.0)
        s = t - 1
        if s < warmup:
            lr = peak * s / warmup
        elif schedule == "google":
            lr = peak * (1 - s / steps)
        else:
            lr = peak * (steps - s) / (steps - warmup)
        c1, c2 = (1 - betas[0] ** t, 1 - betas[1] ** t) if bias_correction else (1.0, 1.0)
        e = eps if placement == "adam_paper" else eps / np.sqrt(c2)
        with torch.no_grad():
            for (name, p), g in zip(params.items(), grads):
                g = g * scale
                m[name].mul_(betas[0]).add_((1 - betas[0]) * g)
                v[name].mul_(betas[1]).add_((1 - betas[1]) * g * g)
                if not ("LayerNorm" in name or name.endswith("bias")):
                    p.sub_(lr * weight_decay * p)
                p.sub_(lr * (m[name] / c1) / (torch.sqrt(v[name] / c2) + e))
    return float(np.mean(losses[-20:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {}
    for seed in seeds:
        batches = make_batches(seed, args.steps)
        for name, variant in VARIANTS.items():
            results.setdefault(name, []).append(train(seed, batches, args.steps, **variant))
    print(f"| variant | final MLM loss per seed {seeds} | mean | vs ours |")
    print("| --- | --- | --- | --- |")
    base = np.mean(results["ours"])
    for name, values in results.items():
        print(f"| {name} | {', '.join(f'{x:.4f}' for x in values)} | {np.mean(values):.4f} | "
              f"{np.mean(values) - base:+.4f} |")
    print(json.dumps({"steps": args.steps, "seeds": seeds, "log_V": float(np.log(V)),
                      "results": results}))


if __name__ == "__main__":
    main()
