"""The documentation's Python code runs as written: every ```python block of README.md and
the docs/ pages (tests/doc_pages.py) runs in a fresh process, in a directory holding small
real files at the paths the block names (a pretraining run made by run_pretraining, its
encoder export, a transformers save_pretrained directory, pretraining TFRecords, ...).

What a block's comments say a line gives (`# [1, 5, 768]`, `# 109482240`, `# [['hello',
...]]`, `# {"mlm_logits": [1, 2, 30522], ...}`) is asserted right after that line. RUNS
says how each block runs (with the earlier blocks of its page whose names it uses, its
environment, and the few rewrites, each an exact replacement that must be found);
NOT_RUNNABLE lists, with the reason, the blocks that cannot run here. A python block in
neither fails the test (in the default tier, a second; the runs are integration tests,
about 2 minutes in all on 2 cores)."""

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
import unicodedata

import pytest

from doc_pages import doc_texts
from pretraining_data import write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# The vocabulary of every file below: BERT's special tokens, the words the blocks' texts
# use, and the jamo pieces of "서울" (an uncased vocabulary decomposes Hangul to jamo).
WORDS = ("hello world win a free cruise now call me lunch at noon tomorrow see you the "
         "prize is yours meeting moved to friday thanks").split()
SEO, UL = unicodedata.normalize("NFD", "서"), unicodedata.normalize("NFD", "울")
JAMO = [SEO[0], "##" + SEO[1]] + ["##" + jamo for jamo in UL]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "!", ".", "?"] + WORDS + JAMO
# The run's model: sizes that all differ, 128 positions (finetuning.md packs to 128).
RUN_CONFIG = dict(vocab_size=len(VOCAB), hidden_size=24, num_hidden_layers=2,
                  num_attention_heads=3, intermediate_size=40, max_position_embeddings=128,
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, hidden_act="gelu",
                  type_vocab_size=2, initializer_range=0.02)

# How each block runs. `blocks`: (page, start of the block's first line), run concatenated
# in that order in one process (a block that uses names an earlier block of its page
# defines runs after it). `env`: set for the process. `rewrites`: (text in the blocks,
# replacement, why); each must occur exactly once. `checks`: (text of the page, code
# appended after the blocks that asserts what that text says in prose; the text must still
# be on the page), besides the checks generated from the comments; `generated`: how many
# comments give checks (a comment the generator stops reading fails the test).
RUNS = {
    "readme_load_checkpoint": dict(
        blocks=[("README.md", "from bert_keras.model_loading import load_checkpoint")],
        generated=1),  # `# a functional keras.Model`
    "encoder_and_pretrainer": dict(
        # The second block uses `encoder`, `inputs` and `np` of the first.
        blocks=[("docs/checkpoints.md", "import numpy as np"),
                ("docs/checkpoints.md", "pretrainer = bert_keras.BertPretrainer(encoder)")],
        generated=6),
    "hf_weights": dict(
        blocks=[("docs/checkpoints.md", "from bert_keras.checkpoints import load_hf_encoder")],
        checks=[('load_hf_weights(encoder, "path/to/dir") # into an existing encoder',
                 "from safetensors.numpy import load_file\n"
                 "tensors = load_file('path/to/dir/model.safetensors')\n"
                 "np.testing.assert_array_equal(\n"
                 "    encoder.get_embedding_table().numpy(),\n"
                 "    tensors['embeddings.word_embeddings.weight'])\n"
                 "assert not np.array_equal(tensors['embeddings.word_embeddings.weight'],\n"
                 "    load_file('path/to/save_pretrained_dir/model.safetensors')"
                 "['embeddings.word_embeddings.weight'])\n")]),
    "real_tokens_on_jax": dict(
        blocks=[("docs/backends.md", "import functools, jax, keras")],
        env={"KERAS_BACKEND": "jax"},
        checks=[("gives the full call's `sequence_output` at real positions",
                 "full = encoder(batch)\n"
                 "real = batch['input_mask'] == 1\n"
                 "assert 0 < real.sum() <= capacity < real.size  # fewer rows than the padded call\n"
                 "np.testing.assert_allclose(np.asarray(outputs['sequence_output'])[real],\n"
                 "    np.asarray(full['sequence_output'])[real], atol=2e-5)\n"
                 "assert not np.asarray(outputs['sequence_output'])[~real].any()\n"
                 "np.testing.assert_allclose(np.asarray(outputs['pooled_output']),\n"
                 "    np.asarray(full['pooled_output']), atol=2e-5)\n")]),
    "fine_tuning_script": dict(
        blocks=[("docs/finetuning.md", "import math")],
        checks=[("save_task_dir(model, \"runs/my_classifier\", labels, ckpt.vocab_file, settings)",
                 "saved = load_checkpoint('runs/my_classifier')\n"
                 "assert saved.form == 'task_dir' and saved.labels == labels == ['ham', 'spam']\n"
                 "assert saved.vocab_file and saved.saved_tokenizer\n")]),
    "pretraining_loop": dict(
        blocks=[("docs/pretraining.md", "import os")],
        rewrites=[("BATCH, STEPS, EVERY = 32, 10000, 1000", "BATCH, STEPS, EVERY = 8, 4, 2",
                   "10,000 updates of BERT-mini take hours on a CPU"),
                  ("validation_steps=100", "validation_steps=2",
                   "100 held-out batches after each epoch: a minute here for nothing more")],
        checks=[("what fine-tuning and the exports read (--init_checkpoint)",
                 "from bert_keras.model_loading import load_checkpoint\n"
                 "saved = load_checkpoint('runs/mine/encoder')\n"
                 "assert saved.form == 'encoder_dir' and saved.vocab_file, saved\n"
                 "assert len(saved.encoder.weights) == len(model.encoder.weights)\n"
                 "for a, b in zip(saved.encoder.weights, model.encoder.weights):\n"
                 "    np.testing.assert_array_equal(a.numpy(), b.numpy())\n"
                 "assert model.optimizer.iterations.numpy() == STEPS\n")]),
    "tokenizer": dict(
        # The second block uses `tok` and `tf` of the first.
        blocks=[("docs/tokenizer.md", "import tensorflow as tf"),
                ("docs/tokenizer.md", "ids, starts, ends = tok.tokenize_with_offsets")],
        generated=2,  # the tokenize output; `ids`: tf.RaggedTensor int32 [B, None]
        checks=[('# int32 ids and int64 byte offsets into each UTF-8 text, RaggedTensors [B, None]:\n'
                 '# b"H\\xc3\\xa9llo" for "hello"; the jamo pieces of "서" each span all of "서"',
                 "assert isinstance(starts, tf.RaggedTensor) and ids.dtype == tf.int32\n"
                 "assert starts.dtype == ends.dtype == tf.int64\n"
                 "data = 'Héllo 서울'.encode()\n"
                 "pieces = [(tok.vocab[i], data[a:b]) for i, a, b in zip(\n"
                 "    ids[0].numpy(), starts[0].numpy(), ends[0].numpy())]\n"
                 "assert pieces[0] == ('hello', b'H\\xc3\\xa9llo'), pieces\n"
                 "assert [p for p in pieces[1:] if p[1] == '서'.encode()] == \\\n"
                 "    [('\\u1109', '서'.encode()), ('##\\u1165', '서'.encode())], pieces\n")]),
    "hub_keras_layer": dict(
        blocks=[("docs/serving.md", "import os\nos.environ[\"TF_USE_LEGACY_KERAS\"]")],
        checks=[("logits = tf.keras.layers.Dense(2)",
                 "x = {name: np.array([[2, 7, 3, 0]], np.int32) for name in inputs}\n"
                 "x['input_mask'] = np.array([[1, 1, 1, 0]], np.int32)\n"
                 "x['input_type_ids'] = np.zeros((1, 4), np.int32)\n"
                 "assert tuple(model(x).shape) == (1, 2)\n"
                 "assert type(model).__module__.startswith('tf_keras'), type(model)\n")]),
    "tfsm_layer": dict(
        blocks=[("docs/serving.md", "import keras")],
        checks=[('call_training_endpoint="call_training")',
                 "x = {'input_word_ids': np.array([[2, 7, 3, 0]], np.int32),\n"
                 "     'input_mask': np.array([[1, 1, 1, 0]], np.int32),\n"
                 "     'input_type_ids': np.zeros((1, 4), np.int32)}\n"
                 "for training in (False, True):\n"
                 "    pooled = encoder(x, training=training)['pooled_output']\n"
                 f"    assert tuple(pooled.shape) == (1, {RUN_CONFIG['hidden_size']})\n")]),
    "grpc_client": dict(
        blocks=[("docs/serving.md", "import grpc")],
        rewrites=[('grpc.insecure_channel("localhost:8500")',
                   'grpc.insecure_channel("localhost:{grpc_port}")',
                   "the test's PredictionService (see GrpcServer) listens on a free port")],
        checks=[('print(tf.make_ndarray(response.outputs["label"])',
                 "label = tf.make_ndarray(response.outputs['label'])\n"
                 "probabilities = tf.make_ndarray(response.outputs['probabilities'])\n"
                 "assert probabilities.shape == (1, 2) and abs(probabilities.sum() - 1) < 1e-5\n"
                 "assert label.tolist() == [[b'ham', b'spam'][probabilities.argmax()]], label\n")]),
}

NOT_RUNNABLE = {
    ("docs/distributed.md",
     "import tensorflow as tf\n\nresolver = tf.distribute.cluster_resolver.TPUClusterResolver"):
        "connects to a TPU (grpc://10.0.0.2:8470); this machine has none",
}

SPAM = ["win a free cruise now!", "call me now, win a prize!", "the prize is yours, call now!",
        "free cruise, win now", "win win a free prize", "call now to win a cruise!"]
HAM = ["lunch at noon tomorrow?", "see you at the meeting", "meeting moved to friday, thanks",
       "thanks, see you tomorrow", "lunch friday?", "the meeting is at noon."]


def python_blocks() -> dict[tuple[str, str], str]:
    """{(page, first line): code} of every ```python block of the documentation pages."""
    blocks = {}
    for page, text in doc_texts().items():
        for code in PYTHON_BLOCK.findall(text):
            key = (page, code.splitlines()[0])
            assert key not in blocks, f"{page}: two python blocks start with {key[1]!r}"
            blocks[key] = code
    return blocks


def find_block(blocks, page, start):
    """The one block of `page` whose text starts with `start`."""
    found = [key for key, code in blocks.items() if key[0] == page and code.startswith(start)]
    assert len(found) == 1, f"{page}: {len(found)} python blocks start with {start!r}"
    return found[0]


# ---- Checks generated from the comments ----------------------------------------------------

_LIST_OF = re.compile(r"list of (\d+) (\[[\d, ]+\])")
_RAGGED = re.compile(r"tf\.RaggedTensor (\w+) \[([\w, ]+)\]")


def _literal_prefix(comment):
    """The longest prefix of `comment` that is a Python literal (ending where a `:` or `;`
    starts the prose), or None."""
    for end in [len(comment)] + [m.start() for m in re.finditer(r"[:;]", comment)][::-1]:
        try:
            return ast.literal_eval(comment[:end].strip())
        except (ValueError, SyntaxError):
            continue
    return None


def expectation(comment):
    """What a comment says a value is, as (kind, expected), or None for prose.

    `[1, 5, 768]`: a shape; `109482240`, `[['hello', ...]]`: a value; `{"name": [shape]}`:
    a dict of shapes; `list of 12 [1, 5, 768]`: a list of shapes; `a functional
    keras.Model`; `tf.RaggedTensor int32 [B, None]`."""
    comment = comment.strip()
    if comment.startswith("a functional keras.Model"):
        return ("functional", None)
    match = _LIST_OF.match(comment)
    if match:
        return ("list_of_shapes", (int(match[1]), ast.literal_eval(match[2])))
    match = _RAGGED.match(comment)
    if match:
        return ("ragged", (match[1], len(match[2].split(","))))
    value = _literal_prefix(comment)
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return ("shapes", value)
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return ("shape", value)
    if isinstance(value, (int, list)) and not isinstance(value, bool):
        return ("equal", value)
    return None


def _comments(source):
    """{line: comment text without '#'} of a code string (line numbers from 1)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string[1:]
    return found


def with_comment_checks(source, where):
    """`source` with `__doc_check(value, kind, expected, "page:line")` after each top-level
    statement whose comment (on its lines, or on comment lines right after it) says what
    it gives; returns (new source, number of checks)."""
    lines = source.splitlines()
    comments = _comments(source)
    body = ast.parse(source).body
    inserts = {}
    for i, statement in enumerate(body):
        last = body[i + 1].lineno - 1 if i + 1 < len(body) else len(lines)
        own = [comments[n] for n in range(statement.lineno, statement.end_lineno + 1)
               if n in comments]
        after = [comments[n] for n in range(statement.end_lineno + 1, last + 1)
                 if n in comments and lines[n - 1].lstrip().startswith("#")]
        said = [e for e in map(expectation, own + after) if e]
        if not said:
            continue
        if isinstance(statement, ast.Expr):
            value = statement.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id == "print" and len(value.args) == 1):
                value = value.args[0]
            expression = ast.get_source_segment(source, value)
        elif (isinstance(statement, ast.Assign) and len(statement.targets) == 1
              and isinstance(statement.targets[0], ast.Name)):
            expression = statement.targets[0].id
        else:
            continue
        kind, expected = said[0]
        inserts[statement.end_lineno] = (f"__doc_check({expression}, {kind!r}, {expected!r}, "
                                         f"{where(statement.lineno)!r})")
    out = []
    for n, line in enumerate(lines, 1):
        out.append(line)
        if n in inserts:
            out.append(inserts[n])
    return "\n".join(out) + "\n", len(inserts)


# Defined first in each run's script: the checks of the comments.
CHECKER = '''
def __doc_check(value, kind, expected, where):
    def shape(x):
        return list(getattr(x, "shape"))

    def plain(x):
        x = x.to_list() if hasattr(x, "to_list") else x
        x = x.tolist() if hasattr(x, "tolist") else x
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x.decode() if isinstance(x, bytes) else x

    if kind == "functional":
        import keras
        from keras.src.models.functional import Functional
        ok = isinstance(value, keras.Model) and isinstance(value, Functional)
        found = type(value).__mro__
    elif kind == "shape":
        found = shape(value)
        ok = found == expected
    elif kind == "shapes":
        found = {k: shape(v) for k, v in value.items()}
        ok = found == expected
    elif kind == "list_of_shapes":
        found = [shape(v) for v in value]
        ok = found == [expected[1]] * expected[0]
    elif kind == "ragged":
        import tensorflow as tf
        found = (type(value).__name__, getattr(value, "dtype", None), len(value.shape))
        ok = isinstance(value, tf.RaggedTensor) and value.dtype.name == expected[0] \\
            and len(value.shape) == expected[1]
    else:
        found = plain(value)
        ok = found == expected
    assert ok, f"{where}: the comment says {expected!r}, the code gives {found!r}"
    print("doc check passed:", where)

'''


def run_script(blocks, name, spec, grpc_port=None):
    """(script text, number of comment checks) of RUNS[name]."""
    keys = [find_block(blocks, page, start) for page, start in spec["blocks"]]
    pages = {key[0] for key in keys}
    assert len(pages) == 1, f"{name}: blocks of one page run together, not {pages}"
    page = pages.pop()
    text = doc_texts()[page]
    parts, count = [], 0
    for key in keys:
        code = blocks[key]
        offset = text[:text.index("```python\n" + code)].count("\n") + 1  # the fence's line
        checked, n = with_comment_checks(code, lambda line, o=offset: f"{page}:{o + line}")
        parts.append(checked)
        count += n
    script = "".join(parts)
    for old, new, why in spec.get("rewrites", ()):
        assert script.count(old) == 1, f"{name}: rewrite {old!r} ({why}) matches " \
                                       f"{script.count(old)} times: update RUNS"
        script = script.replace(old, new.format(grpc_port=grpc_port))
    appended = []
    words = " ".join(text.split())  # the prose, wherever its lines break
    for said, code in spec.get("checks", ()):
        assert " ".join(said.split()) in words, \
            f"{name}: the text {said!r} that a check asserts is gone from {page}: update RUNS"
        appended.append("import numpy as np\n" + code)
    return CHECKER + script + "\n# ---- the test's checks of what the page says ----\n" + \
        "\n".join(appended), count


# ---- The files the blocks read ---------------------------------------------------------------

def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def prepare_files(root, grpc=True):
    """Writes under `root` the files the blocks name, made by the project's tools (and
    transformers for its own format): vocab.txt; data/train-*.tfrecord and
    data/heldout-*.tfrecord (S 128, P 20, with sidecars); out/quickstart/pretrain (a
    run_pretraining run of a tiny model) and runs/phase1 (a copy); its encoder export
    out/quickstart/models/bert_encoder/1; train.jsonl, test.jsonl; two transformers
    save_pretrained directories path/to/save_pretrained_dir and path/to/dir; and, for the
    gRPC client, a classifier export (returned: the path, or None)."""
    import keras

    from bert_keras.model_loading import load_checkpoint
    from bert_keras.run_pretraining import PretrainingOptions, train
    from export.export_encoder import export_encoder

    vocab = os.path.join(root, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in VOCAB)
    os.makedirs(os.path.join(root, "data"))
    write_dataset(os.path.join(root, "data"), num_files=2, per_file=12, max_seq_length=128,
                  max_predictions_per_seq=20, vocab_size=len(VOCAB), prefix="train")
    write_dataset(os.path.join(root, "data"), num_files=1, per_file=8, max_seq_length=128,
                  max_predictions_per_seq=20, vocab_size=len(VOCAB), seed=7, prefix="heldout")

    work = os.path.join(root, "_make")
    os.makedirs(work)
    write_dataset(work, num_files=1, per_file=8, max_seq_length=16, max_predictions_per_seq=3,
                  vocab_size=len(VOCAB))
    with open(os.path.join(work, "bert_config.json"), "w") as f:
        json.dump(RUN_CONFIG, f)
    run_dir = os.path.join(root, "out", "quickstart", "pretrain")
    keras.utils.set_random_seed(5)
    train(PretrainingOptions(
        input_file=os.path.join(work, "train-*.tfrecord"), output_dir=run_dir,
        bert_config_file=os.path.join(work, "bert_config.json"), vocab_file=vocab,
        max_seq_length=16, max_predictions_per_seq=3, train_batch_size=4, num_train_steps=2,
        num_warmup_steps=1, save_checkpoints_steps=2, autotune=False, verbose=0, seed=3))
    shutil.copytree(run_dir, os.path.join(root, "runs", "phase1"))
    ckpt = load_checkpoint(run_dir)
    export_encoder(ckpt.encoder, os.path.join(root, "out", "quickstart", "models", "bert_encoder"),
                   ckpt.vocab_file, version=1, warmup_seq_length=16)

    _write_jsonl(os.path.join(root, "train.jsonl"),
                 [{"text": t, "label": label} for pair in zip(SPAM, HAM)
                  for t, label in zip(pair, ("spam", "ham"))][:10])
    _write_jsonl(os.path.join(root, "test.jsonl"),
                 [{"text": t, "label": label} for t, label in
                  ((SPAM[5], "spam"), (HAM[5], "ham"), (SPAM[4], "spam"))])

    # transformers' own directories (safetensors), two models of one config.
    import torch
    import transformers

    config = transformers.BertConfig(**{k: v for k, v in RUN_CONFIG.items()})
    for seed, name in ((1, "save_pretrained_dir"), (2, "dir")):
        torch.manual_seed(seed)
        transformers.BertModel(config, add_pooling_layer=True).save_pretrained(
            os.path.join(root, "path", "to", name))

    spam = None
    if grpc:
        from bert_keras.tasks import BertClassifier
        from data_prep.tokenization import load_tokenizer
        from export.export_classifier import export_classifier

        settings, _ = ckpt.tokenizer_settings()
        spam = export_classifier(BertClassifier(ckpt.encoder, 2),
                                 load_tokenizer(ckpt.vocab_file, settings), ["ham", "spam"],
                                 os.path.join(work, "spam"), seq_length=16, version=1)
    return spam


class GrpcServer:
    """TF Serving's Predict over gRPC for the docs' client: a PredictionService (the
    tensorflow-serving-api package's own servicer and messages) that runs the request on
    the named signature of a loaded export, input and output tensors converted with
    tf.make_ndarray / tf.make_tensor_proto as TF Serving converts them."""

    def __init__(self, models):
        import grpc
        import tensorflow as tf
        from concurrent import futures
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        loaded = {name: tf.saved_model.load(path) for name, path in models.items()}

        class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
            def Predict(self, request, context):
                model = loaded.get(request.model_spec.name)
                if model is None:
                    context.abort(grpc.StatusCode.NOT_FOUND,
                                  f"Servable not found: {request.model_spec.name}")
                name = request.model_spec.signature_name or "serving_default"
                if name not in model.signatures:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"Serving signature name: \"{name}\" not found")
                signature = model.signatures[name]
                wanted = set(signature.structured_input_signature[1])
                if set(request.inputs) != wanted:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"inputs {sorted(request.inputs)}, expected {sorted(wanted)}")
                outputs = signature(**{k: tf.constant(tf.make_ndarray(v))
                                       for k, v in request.inputs.items()})
                response = predict_pb2.PredictResponse()
                response.model_spec.CopyFrom(request.model_spec)
                for key, value in outputs.items():
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
                return response

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Servicer(),
                                                                            self.server)
        self.port = self.server.add_insecure_port("localhost:0")
        self.server.start()

    def stop(self):
        self.server.stop(grace=None)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("doc_files"))
    spam = prepare_files(root)
    server = GrpcServer({"spam": spam})
    yield root, server.port
    server.stop()


def test_every_python_block_is_run_or_listed():
    blocks = python_blocks()
    run = [find_block(blocks, page, start) for spec in RUNS.values()
           for page, start in spec["blocks"]]
    assert len(run) == len(set(run)), "a block is in two RUNS entries"
    listed = [find_block(blocks, page, start) for page, start in NOT_RUNNABLE]
    assert not set(run) & set(listed)
    missing = set(blocks) - set(run) - set(listed)
    assert not missing, ("python blocks neither run by RUNS nor listed in NOT_RUNNABLE: "
                         f"{sorted(missing)}")


def _undefined_names(code):
    """Names a block reads that it neither imports nor assigns (nor are builtins)."""
    import builtins

    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return sorted({node.id for node in ast.walk(tree)
                   if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)} - bound)


@pytest.mark.parametrize("page,start", sorted(NOT_RUNNABLE))
def test_a_block_that_cannot_run_here_still_parses_and_defines_its_names(page, start):
    blocks = python_blocks()
    code = blocks[find_block(blocks, page, start)]
    assert _undefined_names(code) == [], f"{page}: the block starting {start!r} uses names " \
                                         "it does not import or define"


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(RUNS))
def test_block_runs_as_written(name, prepared, tmp_path):
    root, grpc_port = prepared
    spec = RUNS[name]
    script, checks = run_script(python_blocks(), name, spec, grpc_port)
    assert checks == spec.get("generated", 0), \
        f"{name}: {checks} comments give checks, RUNS expects {spec.get('generated', 0)}"
    work = tmp_path / "work"
    shutil.copytree(root, work, ignore=shutil.ignore_patterns("_make"))
    (work / "snippet.py").write_text(script, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", **spec.get("env", {}))
    done = subprocess.run([sys.executable, "snippet.py"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (f"{name} failed:\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-6000:]}")
    assert done.stdout.count("doc check passed:") == checks, done.stdout[-3000:]
