r"""Writes the TF Model Garden / TF Hub fixtures of tests/test_model_garden.py.

Run with TF Model Garden itself, never with bert-keras (the fixture is the independent
reference the importer is tested against):

    python3.11 -m venv /tmp/tfm && /tmp/tfm/bin/pip install tf-models-official==2.20.0
    cd tests/testdata/model_garden && /tmp/tfm/bin/python make_fixtures.py

Made with tf-models-official 2.20.0, tensorflow 2.20.0, tf-keras 2.20.1, Python 3.11 (CPU).
Writes, beside this script:

  encoder_ckpt/   bert_model.ckpt-1.{index,data-00000-of-00001}, checkpoint, bert_config.json:
                  `tf.train.Checkpoint(encoder=BertEncoder).save`, the layout Model
                  Garden's tf2_bert_encoder_checkpoint_converter writes (its
                  --checkpoint_model_name defaults to "encoder") and its pretrained BERT
                  releases are read with (`tf.train.Checkpoint(encoder=encoder)`).
  pretrainer_ckpt/ the same encoder as BertPretrainerV2 writes it
                  (`tf.train.Checkpoint(**pretrainer.checkpoint_items)`: encoder and
                  masked_lm), with bert_config.json.
  hub_encoder.tar.xz  export_tfhub_lib.export_model of encoder_ckpt (with_mlm=False),
                  vocab.txt and do_lower_case=False: the TF Hub BERT encoder format
                  (hub_encoder/: saved_model.pb, variables/, assets/vocab.txt, the
                  do_lower_case variable). Packed because its saved_model.pb (the traced
                  Keras functions) is 880 KB; tests unpack it into a temporary directory.
  outputs.npz     inputs (batch 3, sequence 7, padded) and the encoder's outputs on them:
                  sequence_output [3, 7, 24], pooled_output [3, 24], encoder_outputs
                  [2, 3, 7, 24] (Model Garden's BertEncoder in Keras), hub_sequence_output,
                  hub_pooled_output (the exported SavedModel, reloaded), and the
                  pretrainer's mlm_logits [3, 2, 41] at masked_lm_positions [3, 2].

Sizes all differ: vocabulary 41, hidden 24, 3 heads, 2 layers, intermediate 40, 29
positions, 3 token types. Every weight is drawn at random (LayerNorm and biases too, at a
scale where each one moves the outputs), so a weight read into the wrong place shows.
"""

import json
import lzma
import os
import shutil
import tarfile
import tempfile

import numpy as np
import tensorflow as tf
import tf_keras

from official.legacy.bert import configs
from official.modeling import tf_utils
from official.nlp.modeling import models
from official.nlp.tools import export_tfhub_lib

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = dict(vocab_size=41, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
              intermediate_size=40, hidden_act="gelu", hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, max_position_embeddings=29,
              type_vocab_size=3, initializer_range=0.02)
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
         + ["The", "the", "Cat", "cat", "sat", "on", "mat", "a", "dog", "ran", "##s", "##ing",
            "Über", "uber", "big", "small", "red", "blue", ".", ",", "!", "?", "and", "or",
            "is", "was", "it", "he", "she", "we", "they", "you", "I", "to", "of", "in"])
assert len(VOCAB) == CONFIG["vocab_size"], len(VOCAB)


def randomize(variables, rng):
    """Every variable drawn afresh: N(0, 0.3) (LayerNorm gammas around 1)."""
    for v in variables:
        value = rng.normal(0.0, 0.3, v.shape)
        if "gamma" in v.name:
            value += 1.0
        v.assign(value.astype(np.float32))


def _reproducible(info):
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def fresh(directory):
    path = os.path.join(HERE, directory)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def main():
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(20261206)
    bert_config = configs.BertConfig.from_dict(CONFIG)
    encoder = export_tfhub_lib.get_bert_encoder(bert_config)
    # As tf2_bert_encoder_checkpoint_converter builds it: Model Garden's get_activation
    # ("gelu") is the tanh approximation, in the encoder and in the masked-LM head alike.
    pretrainer = models.BertPretrainerV2(
        encoder_network=encoder, mlm_activation=tf_utils.get_activation(CONFIG["hidden_act"]),
        mlm_initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02))
    inputs = dict(
        input_word_ids=np.array([[2, 5, 8, 9, 3, 0, 0], [2, 17, 30, 12, 40, 22, 3],
                                 [2, 7, 3, 13, 14, 3, 0]], np.int32),
        input_mask=np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1],
                             [1, 1, 1, 1, 1, 1, 0]], np.int32),
        input_type_ids=np.array([[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 2, 2],
                                 [0, 0, 0, 1, 1, 1, 0]], np.int32),
    )
    positions = np.array([[1, 3], [2, 5], [4, 1]], np.int32)
    pretrainer(dict(inputs, masked_lm_positions=positions), training=False)  # builds it
    randomize(pretrainer.weights, rng)
    out = encoder(inputs, training=False)
    mlm = pretrainer(dict(inputs, masked_lm_positions=positions), training=False)

    encoder_dir = fresh("encoder_ckpt")
    prefix = tf.train.Checkpoint(encoder=encoder).save(
        os.path.join(encoder_dir, "bert_model.ckpt"))
    pretrainer_dir = fresh("pretrainer_ckpt")
    tf.train.Checkpoint(**pretrainer.checkpoint_items).save(
        os.path.join(pretrainer_dir, "bert_model.ckpt"))
    for directory in (encoder_dir, pretrainer_dir):
        with open(os.path.join(directory, "bert_config.json"), "w") as f:
            json.dump(CONFIG, f, indent=2)

    vocab_file = os.path.join(HERE, "vocab.txt.in")
    with open(vocab_file, "w") as f:
        f.write("".join(token + "\n" for token in VOCAB))
    staged = tempfile.mkdtemp()
    hub_dir = os.path.join(staged, "hub_encoder")
    # The asset keeps the file's name: TF Hub's encoders hold assets/vocab.txt.
    shutil.copy(vocab_file, os.path.join(staged, "vocab.txt"))
    export_tfhub_lib.export_model(hub_dir, bert_config=bert_config,
                                  model_checkpoint_path=prefix, with_mlm=False,
                                  vocab_file=os.path.join(staged, "vocab.txt"),
                                  do_lower_case=False)
    os.remove(vocab_file)

    hub = tf.saved_model.load(hub_dir)
    hub_out = hub(inputs, training=False)
    assert hub.do_lower_case.numpy() is np.False_ or not hub.do_lower_case.numpy()
    np.savez(
        os.path.join(HERE, "outputs.npz"), **inputs, masked_lm_positions=positions,
        sequence_output=out["sequence_output"].numpy(),
        pooled_output=out["pooled_output"].numpy(),
        encoder_outputs=np.stack([x.numpy() for x in out["encoder_outputs"]]),
        hub_sequence_output=hub_out["sequence_output"].numpy(),
        hub_pooled_output=hub_out["pooled_output"].numpy(),
        mlm_logits=mlm["mlm_logits"].numpy())
    with tarfile.open(os.path.join(HERE, "hub_encoder.tar.xz"), "w:xz",
                      preset=9 | lzma.PRESET_EXTREME) as tar:
        tar.add(hub_dir, "hub_encoder", filter=_reproducible)
    shutil.rmtree(staged)
    print("max |keras - hub| sequence_output:",
          np.abs(out["sequence_output"].numpy() - hub_out["sequence_output"].numpy()).max())


if __name__ == "__main__":
    main()
