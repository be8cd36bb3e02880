"""The CSV reader: the shortest format written to the reader protocol (padpipe.readers.format)."""

import pytest

from padpipe import Consumer, DataError
from padpipe.readers.csv import CsvReader
from tests.contract import check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows


@pytest.fixture
def folder(tmp_path):
    """Three CSV files of 5, 3 and 7 rows."""
    for name, start, n in [("b.csv", 5, 3), ("a.csv", 0, 5), ("sub/c.csv", 8, 7)]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        lines = [f"{i},row {i},{i % 3}" for i in range(start, start + n)]
        (tmp_path / name).write_text("id,text,label\n" + "\n".join(lines) + "\n")
    return tmp_path


def expected(columns=("id", "text", "label")):
    return [{k: v for k, v in {"id": i, "text": f"row {i}", "label": i % 3}.items() if k in columns} for i in range(15)]


def reader(folder, **options):
    return CsvReader(paths=str(folder), consumer=options.pop("consumer", Consumer()), **options)


def test_read_csv_works(folder):
    [batches] = epoch_batches(reader(folder, chunk_rows=2))
    assert rows(batches) == expected()
    assert max(b.num_rows for b in batches) == 2
    assert rows(epoch_batches(reader(folder, columns=["text", "id"]))[0]) == [
        {"text": r["text"], "id": r["id"]} for r in expected()
    ]


def test_read_csv_splits_files_between_consumers(folder):
    check_split(lambda c: reader(folder, consumer=c, seed=3), expected(), "id")


def test_read_csv_saves_and_restores_its_state(folder):
    check_node_resume(lambda: reader(folder, chunk_rows=2))
    check_node_resume(lambda: reader(folder, chunk_rows=3, seed=1, columns=["id"]))


def test_read_csv_raises_error_naming_the_file_when_a_column_is_missing(folder):
    with pytest.raises(DataError, match=r"^\S+a\.csv: cannot read unit 0 from row 0: .*'nope'"):
        epoch_batches(reader(folder, columns=["nope"]))


def test_pp_read_csv_tokenizes_pairs_and_resumes_through_the_loader(folder):
    """The public reader: a whole pipeline (tokenize, bucket, pad) over CSV files, every row once, exact resume."""
    import padpipe as pp
    from padpipe.inspection.formats import format_of, read_corpus

    pipe = pp.read_csv(str(folder)).tokenize(pp.examples.tokenizer(), fields=("text",)).batch(4).pad()
    loader = pipe.loader()
    batches = list(loader)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(15))
    again = pipe.loader()
    it = iter(again)
    next(it)
    state = again.state_dict()
    resumed = pipe.loader()
    resumed.load_state_dict(state)
    assert [b["input_ids"].tolist() for b in resumed] == [b["input_ids"].tolist() for b in batches[1:]]
    assert format_of(str(folder)) == "csv"
    assert read_corpus([str(folder / "a.csv")]).source.name == "read_csv"
    with pytest.raises(FileNotFoundError, match=r"nothing\.csv"):
        pp.read_csv(str(folder / "nothing.csv"))
