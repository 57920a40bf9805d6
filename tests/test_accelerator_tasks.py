"""bench/accelerator_tasks.py: the fine-tuning and inference modes' sides at the tiny size.

Every side of both modes is built and run in one fresh process on Keras' JAX backend in
which TensorFlow cannot be imported (as on the GPU machine); the model, loss and optimizer
of ours are checked against run_classifier's, and the FLOP counts against the models'
weights.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, without_tensorflow_env

sys.path.insert(0, os.path.join(REPO, "bench"))

import accelerator_tasks  # noqa: E402

SIZES = accelerator_tasks.SIZES


def test_synthetic_examples_are_right_padded_and_the_same_every_time():
    size = SIZES["finetune"]["tiny"]
    data = accelerator_tasks.synthetic_examples(size, count=3)
    rows, seq = 3 * size["batch"], size["seq"]
    assert {k: v.shape for k, v in data.items()} == {
        "ids": (rows, seq), "mask": (rows, seq), "types": (rows, seq), "labels": (rows,)}
    lengths = data["mask"].sum(1)
    assert lengths.min() >= size["min_length"] and lengths.max() <= seq
    assert len(set(lengths.tolist())) > 3  # lengths vary
    for row, length in zip(range(rows), lengths):
        assert data["mask"][row].tolist() == [1] * length + [0] * (seq - length)
        assert data["ids"][row, 0] == accelerator_tasks.CLS_ID
        assert data["ids"][row, length - 1] == accelerator_tasks.SEP_ID
        assert (data["ids"][row, length:] == 0).all() and (data["types"][row, length:] == 0).all()
        assert data["ids"][row, 1:length - 1].min() > accelerator_tasks.SEP_ID
        assert data["types"][row, :length].tolist() == [0] * (length // 2) + [1] * (
            length - length // 2)
    assert set(data["labels"].tolist()) == {0, 1}
    again = accelerator_tasks.synthetic_examples(size, count=3)
    assert all((again[k] == data[k]).all() for k in data)
    inference = accelerator_tasks.synthetic_examples(SIZES["inference"]["tiny"])
    assert "labels" not in inference and len(inference["ids"]) == 4 * 10


def test_flops_are_those_of_the_models_weights():
    # Independent of the formula: every encoder kernel does one multiply-add per weight and
    # token (2 FLOPs), the attention scores and weighted sum 2 x 2 S^2 H per layer, the
    # pooler and the head run on one row each; training is 3 x forward.
    from bert_keras import BertEncoder
    from bert_keras.tasks import BertClassifier
    from bench_pretraining import training_flops_per_sequence

    size = SIZES["finetune"]["tiny"]
    encoder = BertEncoder(vocab_size=size["vocab"], num_layers=size["layers"],
                          hidden_size=size["hidden"], num_heads=size["heads"],
                          intermediate_size=size["intermediate"])
    classifier = BertClassifier(encoder, size["labels"])

    def kernel_weights(layers):
        return sum(int(np.prod(w.shape)) for layer in layers for w in layer.weights
                   if "kernel" in w.path)

    seq, hidden = size["seq"], size["hidden"]
    forward = (2 * seq * kernel_weights(encoder.transformer_layers)
               + size["layers"] * 4 * seq * seq * hidden
               + 2 * kernel_weights([encoder.pooler_layer]))
    assert accelerator_tasks.flops_per_example("inference", size) == forward
    head = 2 * kernel_weights([classifier.classifier])
    assert accelerator_tasks.flops_per_example("finetune", size) == 3 * (forward + head)
    # Two labels: the head is the size of pretraining's next-sentence head.
    assert accelerator_tasks.flops_per_example("finetune", size) == training_flops_per_sequence(
        size["layers"], hidden, size["intermediate"], size["vocab"], seq, 0, nsp=True)
    # BERT-base S128: about 22.4 GFLOP a forward (2 x 85M encoder weights x 128 tokens).
    base = SIZES["inference"]["base"]
    assert accelerator_tasks.flops_per_example("inference", base) == pytest.approx(22.4e9,
                                                                                  rel=0.01)


def test_ours_is_run_classifiers_model_loss_and_optimizer():
    from bert_keras.finetuning.classification import ClassificationTask, ClassifierOptions
    from bert_keras.finetuning.runner import FinetuneOptions
    from bert_keras.optimization import create_optimizer
    from bert_keras.tasks import compile_args

    size = SIZES["finetune"]["tiny"]
    model, feed = accelerator_tasks.keras_finetune_model("ours", size)
    common, options = FinetuneOptions(), ClassifierOptions()
    tool = ClassificationTask().build(model.encoder, ["neg", "pos"], options,
                                      common.head_initializer)

    def unnamed(config):
        return {k: v for k, v in config.items() if k != "name"}

    assert type(model) is type(tool)
    assert unnamed(model.get_config()) == unnamed(tool.get_config())
    assert model.encoder.layers_dtype_policy.name == "mixed_bfloat16"
    assert model.layers[-1].compute_dtype == "bfloat16"  # the head follows the encoder
    assert all(v.dtype == "float32" for v in model.weights)
    # loop.train: create_optimizer(learning rate, steps, warmup) with the flags' schedule
    # and epsilon placement; compile(**compile_args(model)).
    expected = create_optimizer(accelerator_tasks.LEARNING_RATE, 10 ** 6, 0,
                                lr_schedule=common.lr_schedule,
                                epsilon_placement=common.epsilon_placement)
    assert unnamed(model.optimizer.get_config()) == unnamed(expected.get_config())
    assert model.jit_compile
    losses = compile_args(tool)["loss"]
    assert {k: (type(v), v.get_config()) for k, v in model.loss.items()} == {
        k: (type(v), v.get_config()) for k, v in losses.items()}
    x, y = feed(accelerator_tasks.synthetic_examples(size, count=1))
    assert set(x) == set(model.input) and y["logits"].shape == (size["batch"],)


def test_unknown_modes_sides_and_sizes_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown mode 'serve'"):
        accelerator_tasks.build("serve", "ours", "tiny")
    with pytest.raises(ValueError, match="unknown side 'mxnet'"):
        accelerator_tasks.build("inference", "mxnet", "tiny")
    with pytest.raises(ValueError, match=r"unknown finetune size 'huge'; expected one of "
                                         r"\['base', 'large', 'tiny'\]"):
        accelerator_tasks.build("finetune", "torch", "huge")


# The fresh process: every side of both modes (torch's first: their timing would suffer
# from the JAX threads, and nothing here is timed against anything), then ours learning.
RUN_SIDES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import accelerator_tasks as tasks

    results = {"runs": {}}
    for mode, side in (pair.split(":") for pair in sys.argv[1].split(",")):
        run = tasks.build(mode, side, "tiny")
        results["runs"][f"{mode}:{side}"] = [run(2), run(2)]

    # The jitted stateless call gives what the model's own call gives.
    size = tasks.SIZES["inference"]["tiny"]
    model, feed = tasks.keras_inference_model("ours", size)
    inputs = feed(tasks.synthetic_examples(size, count=1))
    jitted = tasks.jitted_forward(model)(inputs)
    eager = model(inputs, training=False)
    results["forward"] = {k: dict(shape=list(v.shape), dtype=str(v.dtype),
                                  max_difference=float(np.max(np.abs(
                                      np.asarray(v, np.float32)
                                      - np.asarray(eager[k], np.float32)))))
                          for k, v in jitted.items()}

    # On the real tokens only (ours@real_tokens): the full call's values at real positions,
    # zeros at padding, at two capacities (exact and with spare rows).
    from bert_keras.layers import padding_free
    mask = np.asarray(inputs["input_mask"])
    results["real_tokens"] = {}
    for multiple in (1, 64):
        capacity = padding_free.row_capacity(mask, multiple)
        out = tasks.real_tokens_forward(model)(inputs, capacity)
        sequence = np.asarray(out["sequence_output"], np.float32)
        full = np.asarray(jitted["sequence_output"], np.float32)
        results["real_tokens"][multiple] = dict(
            capacity=capacity, real=int(mask.sum()), rows=int(mask.size),
            real_difference=float(np.max(np.abs(sequence - full)[mask == 1])),
            padding_max=float(np.max(np.abs(sequence[mask == 0]))),
            pooled_difference=float(np.max(np.abs(
                np.asarray(out["pooled_output"], np.float32)
                - np.asarray(jitted["pooled_output"], np.float32)))))
    run = tasks.build("inference", "ours", "tiny", real_tokens=16)
    results["runs"]["inference:ours@real_tokens=16"] = [run(2), run(2)]

    # Ours learns a learnable task: the label decides which half of the vocabulary the
    # words come from.
    size = tasks.SIZES["finetune"]["tiny"]
    data = tasks.synthetic_examples(size, count=20, seed=1)
    low = tasks.SEP_ID + 1
    half = (size["vocab"] - low) // 2
    words = (data["mask"] == 1) & (data["ids"] > tasks.SEP_ID)
    data["ids"] = np.where(words, low + (data["ids"] - low) % half
                           + data["labels"][:, None] * half, data["ids"]).astype(np.int32)
    model, feed = tasks.keras_finetune_model("ours", size, learning_rate=1e-3)
    x, y = feed(data)
    train = 16 * size["batch"]
    held_out = ({k: v[train:] for k, v in x.items()}, {k: v[train:] for k, v in y.items()})
    before = model.evaluate(*held_out, batch_size=size["batch"], verbose=0, return_dict=True)
    history = model.fit({k: v[:train] for k, v in x.items()},
                        {k: v[:train] for k, v in y.items()}, batch_size=size["batch"],
                        epochs=4, shuffle=False, verbose=0).history
    after = model.evaluate(*held_out, batch_size=size["batch"], verbose=0, return_dict=True)
    results.update(before=before, after=after, epoch_losses=history["loss"],
                   held_out=len(data["ids"]) - train, tensorflow="tensorflow" in sys.modules)
    print("RESULT " + json.dumps(results))
""")


def _torch_compile_skip_reason():
    """Why torch.compile cannot run here, or None: on a CPU, inductor compiles C++."""
    import torch

    if torch.cuda.is_available() or os.environ.get("CXX") or shutil.which("g++") or \
            shutil.which("clang++"):
        return None
    return "torch.compile on a CPU needs a C++ compiler (g++ or clang++; none found)"


# Every side of every mode in one fresh process without TensorFlow (about 50 s): the
# integration tier's kind of test, so `make test` leaves it to `make test-integration`.
@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("accelerator_tasks")
    script = folder / "run_sides.py"
    script.write_text(RUN_SIDES)
    sides = [s for s in accelerator_tasks.SIDES
             if s != "torch_compile" or _torch_compile_skip_reason() is None]
    order = sorted(sides, key=lambda s: not s.startswith("torch"))
    pairs = ",".join(f"{mode}:{side}" for side in order for mode in accelerator_tasks.MODES)
    env = without_tensorflow_env("jax", folder)
    env["PYTHONPATH"] += os.pathsep + os.path.join(REPO, "bench")
    done = subprocess.run([sys.executable, str(script), pairs], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


@pytest.mark.integration
@pytest.mark.parametrize("side", accelerator_tasks.SIDES)
@pytest.mark.parametrize("mode", accelerator_tasks.MODES)
def test_every_side_runs_two_steps_without_tensorflow(tiny_runs, mode, side):
    if side == "torch_compile" and _torch_compile_skip_reason():
        pytest.skip(_torch_compile_skip_reason())
    assert not tiny_runs["tensorflow"]
    seconds = tiny_runs["runs"][f"{mode}:{side}"]
    assert len(seconds) == 2 and all(np.isfinite(s) and s > 0 for s in seconds)


@pytest.mark.integration
def test_ours_jitted_forward_is_the_encoders_call(tiny_runs):
    size = SIZES["inference"]["tiny"]
    forward = tiny_runs["forward"]
    assert forward["sequence_output"]["shape"] == [size["batch"], size["seq"], size["hidden"]]
    assert forward["pooled_output"]["shape"] == [size["batch"], size["hidden"]]
    for output in forward.values():
        assert output["dtype"] == "bfloat16"
        # The same program's arithmetic up to XLA's fusion choices: bfloat16 rounding
        # (2^-8 relative) on values of order 1.
        assert output["max_difference"] <= 0.05


@pytest.mark.integration
def test_ours_on_real_tokens_is_the_encoders_call_at_real_positions(tiny_runs):
    found = tiny_runs["real_tokens"]
    exact, spare = found["1"], found["64"]
    # The tiny batch has padding (lengths uniform in [12, 24]), so the capacity is below B * S.
    assert exact["capacity"] == exact["real"] < exact["rows"]
    assert exact["real"] < spare["capacity"] <= spare["rows"]
    for found_at in (exact, spare):
        # Row-by-row the same arithmetic; matmuls of another row count may round
        # differently in bfloat16 (2^-8 relative on values of order 1).
        assert found_at["real_difference"] <= 0.05
        assert found_at["pooled_difference"] <= 0.05
        assert found_at["padding_max"] == 0
    seconds = tiny_runs["runs"]["inference:ours@real_tokens=16"]
    assert len(seconds) == 2 and all(np.isfinite(s) and s > 0 for s in seconds)


def test_real_tokens_is_an_option_of_ours_inference_only():
    with pytest.raises(ValueError, match="real_tokens is an option of the inference mode's "
                                         "ours side, not of finetune ours"):
        accelerator_tasks.build("finetune", "ours", "tiny", real_tokens=16)


@pytest.mark.integration
def test_ours_finetuning_learns_a_learnable_task(tiny_runs):
    before, after = tiny_runs["before"], tiny_runs["after"]
    # Untrained, the 2-way loss is about ln 2.
    assert before["loss"] == pytest.approx(np.log(2), abs=0.1)
    assert after["loss"] < before["loss"] - 0.3
    assert tiny_runs["epoch_losses"][-1] < tiny_runs["epoch_losses"][0] - 0.2
    # 32 held-out examples: by chance, 26 or more right has probability 3e-4.
    assert after["accuracy"] * tiny_runs["held_out"] >= 26
