"""Parsers of the published formats, Hub row conversion and data-source resolution."""

from __future__ import annotations

import json

import pytest

from aot_transformers.evaluation import DataFormatError, EvaluationError, read_cbt, read_lambada, read_ptb
from aot_transformers.evaluation.data import read_wikitext, wikitext_documents
from aot_transformers.evaluation.tasks import (
    DATASETS,
    DataSource,
    load_source,
    parse_source,
    parse_task_names,
    resolve_sources,
)
from support import FIXTURES

CBT_CN = FIXTURES / "cbtest_CN_test_fixture.txt"
CBT_NE = FIXTURES / "cbtest_NE_test_fixture.txt"
WIKITEXT = FIXTURES / "wiki.test.raw"


# ------------------------------------------------------------------------------------------------------------------
# CBT


def test_cbt_published_format_is_parsed():
    examples = read_cbt(CBT_CN)
    assert len(examples) == 2
    first = examples[0]
    assert len(first.sentences) == 20
    assert first.sentences[0] == "Once upon a time a little fox lived at the edge of a great green wood ."
    assert first.question == "There he found the fox waiting for him with the XXXXX ."
    assert first.answer == "heron"
    assert len(first.candidates) == 10 and first.candidates[first.label] == "heron"
    context, continuation = first.scoring_pair("basket")
    assert context == first.context + " There he found the fox waiting for him with the"
    assert continuation == " basket ."
    ne = read_cbt(CBT_NE)
    assert [example.answer for example in ne] == ["Tom", "Mary"]


def _write_cbt(tmp_path, lines):
    path = tmp_path / "cbt.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _block(question="the XXXXX ran .\tdog\t\tcat|dog|fox"):
    return [f"{i} sentence {i} ." for i in range(1, 21)] + [f"21 {question}"]


@pytest.mark.parametrize(
    "lines,line,message",
    [
        (_block()[:5] + ["7 skipped a line ."], 6, "expected a line starting with 6"),
        (_block("the XXXXX ran .\tdog"), 21, "tab-separated fields"),
        (_block("the XXXXX ran .\twolf\t\tcat|dog|fox"), 21, "not among the candidates"),
        (_block("the dog ran .\tdog\t\tcat|dog|fox"), 21, "must contain XXXXX"),
        (_block()[:10] + ["", *_block()[10:]], 11, "blank line inside a block"),
        (_block()[:-1], 20, "ends inside a block"),
        (['{"text": "not cbt"}'], 1, "expected a line starting with 1"),
    ],
)
def test_cbt_format_errors_name_the_line(tmp_path, lines, line, message):
    path = _write_cbt(tmp_path, lines)
    with pytest.raises(DataFormatError, match=message) as error:
        read_cbt(path)
    assert error.value.line == line
    assert f"{path}, line {line}:" in str(error.value)


# ------------------------------------------------------------------------------------------------------------------
# WikiText, PTB, LAMBADA


def test_wikitext_articles():
    articles = read_wikitext(WIKITEXT)
    assert len(articles) == 2
    assert articles[0].startswith(" = Green Hill Mill = \n\n Green Hill Mill is")
    assert " = = History = = " in articles[0]  # section headings stay inside their article
    assert articles[1].startswith(" = Lune Valley Railway = \n")
    assert all(article.endswith(" \n") and not article.endswith("\n\n") for article in articles)


def test_wikitext_hub_rows_give_the_same_articles():
    """The Hub copy stores blank lines as '' and keeps the newline of the others."""
    lines = WIKITEXT.read_text().splitlines(keepends=True)
    hub_rows = ["" if not line.strip() else line for line in lines]
    assert wikitext_documents(hub_rows) == read_wikitext(WIKITEXT)


def test_wikitext_text_before_a_title_is_an_error(tmp_path):
    path = tmp_path / "wiki.test.raw"
    path.write_text(" \n some text without a title \n = Title = \n")
    with pytest.raises(DataFormatError, match=r"line 2: expected a WikiText article title"):
        read_wikitext(path)


def test_ptb_is_one_document_of_sentences(tmp_path):
    path = tmp_path / "ptb.test.txt"
    path.write_text(" no it was n't black monday \n but while the new york stock exchange did n't fall <unk> \n")
    assert read_ptb(path) == ["no it was n't black monday\nbut while the new york stock exchange did n't fall <unk>\n"]
    path.write_text(" one sentence \n\n another \n")
    with pytest.raises(DataFormatError, match="line 2: blank line"):
        read_ptb(path)
    path.write_text(' a sentence \n{"text": "json"}\n')
    with pytest.raises(DataFormatError, match="line 2: a JSON object"):
        read_ptb(path)


def test_lambada_jsonl(tmp_path):
    path = tmp_path / "lambada.jsonl"
    path.write_text('{"text": "he looked at the dog"}\n\n{"text": "she fed the cat"}\n')
    assert read_lambada(path) == ["he looked at the dog", "she fed the cat"]
    for bad, message in [
        ('{"text": "fine passage"}\nnot json\n', "line 2: not JSON"),
        ('{"txt": "wrong key"}\n', 'line 1: expected a JSON object with a string field "text"'),
        (
            '{"text": "fine passage"}\n{"text": "oneword"}\n',
            "line 2: a LAMBADA passage needs a context and a last word",
        ),
    ]:
        path.write_text(bad)
        with pytest.raises(DataFormatError, match=message):
            read_lambada(path)


def test_shared_dev_samples_parse(shared_data):
    passages = read_lambada(shared_data / "eval-dev" / "lambada" / "lambada_dev100.jsonl")
    assert len(passages) == 100
    (document,) = read_ptb(shared_data / "eval-dev" / "ptb" / "ptb.valid.txt")
    assert document.count("\n") == 3370 and "<unk>" in document


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(EvaluationError, match="data file not found"):
        read_cbt(tmp_path / "nope.txt")


def test_non_utf8_file_names_the_line(tmp_path):
    path = tmp_path / "ptb.test.txt"
    path.write_bytes(b" fine \n bad \xff byte \n")
    with pytest.raises(DataFormatError, match="line 2: not UTF-8"):
        read_ptb(path)


# ------------------------------------------------------------------------------------------------------------------
# Sources


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(
        EvaluationError, match=r"unknown task\(s\) \['hellaswag'\]; valid tasks: wikitext, ptb, lambada"
    ):
        parse_task_names("ptb,hellaswag")
    assert parse_task_names("all") == parse_task_names(None) == list(parse_task_names("all"))
    assert parse_task_names(" ptb , ptb,lambada_acc ") == ["ptb", "lambada_acc"]


def test_sources_from_data_dir_overrides_and_hub(tmp_path):
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.valid.txt").write_text(" a b c \n")
    (tmp_path / "ptb.test.txt").write_text(" a b c \n")
    (tmp_path / "cbtest_CN_test_fixture.txt").write_text(CBT_CN.read_text())
    sources = resolve_sources(
        ["ptb", "lambada", "lambada_acc", "cbt_cn", "wikitext"], tmp_path, {"lambada_acc": "x.jsonl"}
    )
    assert sources["ptb"].path == tmp_path / "ptb.test.txt"  # the test split is preferred
    assert sources["lambada"].path.name == "x.jsonl"  # a task override applies to its dataset
    assert sources["cbt_cn"].path.name == "cbtest_CN_test_fixture.txt"
    assert sources["wikitext"].hub == DATASETS["wikitext"].hub  # nothing local: the Hub default
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "ptb.test.txt").write_text(" a \n")
    with pytest.raises(EvaluationError, match="several ptb files"):
        resolve_sources(["ptb"], tmp_path)
    with pytest.raises(EvaluationError, match="unknown task 'hellaswag'"):
        resolve_sources(["ptb"], None, {"hellaswag": "x"})


def test_hub_spec_parsing():
    source = parse_source("wikitext", "hub:Salesforce/wikitext:wikitext-103-raw-v1")
    assert (source.hub.path, source.hub.name, source.hub.split) == (
        "Salesforce/wikitext",
        "wikitext-103-raw-v1",
        "test",
    )
    other = parse_source("lambada", "hub:someone/lambada_copy::validation")
    assert (other.hub.path, other.hub.name, other.hub.split) == ("someone/lambada_copy", None, "validation")
    with pytest.raises(EvaluationError, match="hub:REPO_ID"):
        parse_source("ptb", "hub:")


def test_hub_loader_with_a_local_stand_in(tmp_path, monkeypatch):
    """`datasets.load_dataset` on a folder with the Hub's columns stands in for the Hub (no network in tests)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    cbt = tmp_path / "cbt"
    cbt.mkdir()
    rows = [
        {"sentences": list(e.sentences), "question": e.question, "answer": e.answer, "options": list(e.candidates)}
        for e in read_cbt(CBT_CN)
    ]
    (cbt / "test.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    from_hub = load_source(parse_source("cbt_cn", f"hub:{cbt}::test"))
    assert from_hub == read_cbt(CBT_CN)

    lambada = tmp_path / "lambada"
    lambada.mkdir()
    (lambada / "test.jsonl").write_text('{"text": "a b c"}\n{"text": "d e"}\n')
    assert load_source(parse_source("lambada", f"hub:{lambada}")) == ["a b c", "d e"]

    ptb = tmp_path / "ptb"
    ptb.mkdir()
    (ptb / "test.jsonl").write_text('{"sentence": "a b"}\n{"sentence": "c d <unk>"}\n')
    assert load_source(parse_source("ptb", f"hub:{ptb}")) == ["a b\nc d <unk>\n"]
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['text'\]"):
        load_source(parse_source("wikitext", f"hub:{ptb}"))


def test_unreachable_hub_says_how_to_use_local_files(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'cam-cst/cbt' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(EvaluationError, match=r"could not load hub:.*--data-dir DIR or --data cbt_ne=PATH"):
        load_source(DataSource("cbt_ne", hub=DATASETS["cbt_ne"].hub))
