"""Makes the Hugging Face golden files that tests/test_hf_parity.py checks without torch.

For each activation ("gelu" = exact erf, "gelu_new" = tanh approximation) this builds a
randomly initialised transformers `BertModel` whose sizes all differ (vocab 99, hidden 32,
4 heads, intermediate 37, 3 layers, 40 positions, so a transposed or swapped weight cannot
pass), saves it with `save_pretrained` into `hf_bert_<act>/`, runs it in float32 on a fixed
padded batch and stores inputs and every output in `hf_bert_<act>/golden.npz`.

Run from the repository root (needs torch and transformers, see requirements-dev.txt):
    .venv/bin/python tests/testdata/make_hf_golden.py
"""

import os

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    num_hidden_layers=3,
    max_position_embeddings=40,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
)


def golden_inputs():
    """A batch of 3 sequences of length 11 with different amounts of padding."""
    rng = np.random.default_rng(1234)
    lengths = [11, 7, 2]
    ids = rng.integers(1, SIZES["vocab_size"], size=(3, 11)).astype(np.int32)
    mask = (np.arange(11)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    types = np.zeros((3, 11), np.int32)
    types[0, 6:] = 1  # A pair in the first row.
    types[1, 4:7] = 1
    ids = ids * mask  # padding id 0
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def run_hf(model, inputs):
    """float32 outputs of a transformers BertModel on our input dict."""
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(inputs["input_word_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["input_type_ids"], dtype=torch.long),
            output_hidden_states=True,
        )
    return {
        "sequence_output": out.last_hidden_state.numpy(),
        "pooled_output": out.pooler_output.numpy(),
        # hidden_states[0] is the embedding output; [1:] are the layers.
        "encoder_outputs": np.stack([h.numpy() for h in out.hidden_states[1:]]),
    }


def make_model(hidden_act, seed):
    torch.manual_seed(seed)
    # initializer_range 0.2 instead of BERT's 0.02: feed-forward pre-activations then reach
    # |x| ~ 1-3, where exact and tanh GELU differ by ~1e-3, so the golden outputs can tell
    # "gelu" from "gelu_new" (with 0.02 the two agree to ~1e-6).
    config = transformers.BertConfig(hidden_act=hidden_act, initializer_range=0.2, **SIZES)
    model = transformers.BertModel(config)
    # Non-trivial LayerNorm and bias values, so a missed or swapped one shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def main():
    inputs = golden_inputs()
    for seed, act in enumerate(("gelu", "gelu_new")):
        out_dir = os.path.join(HERE, f"hf_bert_{act}")
        model = make_model(act, seed)
        model.save_pretrained(out_dir, safe_serialization=True)
        outputs = run_hf(model, inputs)
        np.savez(os.path.join(out_dir, "golden.npz"), **inputs, **outputs)
        print(f"wrote {out_dir} (transformers {transformers.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
