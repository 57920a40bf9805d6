"""Fine-tuning: one train / evaluate / predict loop, and a thin adapter per task.

    runner.py          the skeleton every tool runs, its shared flags (FinetuneOptions)
    loop.py            tf.data over arrays, fit with BERT's optimizer, batched prediction
    classification.py  sentence (pair) classification: BertClassifier, accuracy / F1
    regression.py      sentence (pair) regression (STS-B): BertRegressor, Pearson / Spearman
    tagging.py         token tagging: BertTagger, token accuracy / entity F1
    squad.py           span QA: BertSpanQA, the official SQuAD EM / F1

The command lines are bert_keras/run_classifier.py, run_regressor.py, run_tagger.py and
run_squad.py.
See docs/DESIGN.md section 7.
"""
