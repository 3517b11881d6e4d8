import numpy as np
import pytest

from focusattn.data.corpora import Document, load_corpus, split_documents, strip_gutenberg
from focusattn.data.tokens import check_length, eval_windows


def test_strip_gutenberg_removes_licence():
    text = "Header\n*** START OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nTo be.\n*** END OF THE PROJECT GUTENBERG EBOOK"
    assert strip_gutenberg(text) == "To be."
    assert strip_gutenberg("plain text") == "plain text"


def test_split_is_by_document_deterministic_and_disjoint():
    docs = [Document(f"work-{i}", f"text {i} " * 50) for i in range(40)]
    a, b = split_documents("x", docs), split_documents("x", list(reversed(docs)))
    assert {d.title for d in a.val} == {d.title for d in b.val}
    assert not {d.title for d in a.val} & {d.title for d in a.train}
    assert len(a.val) >= 1 and len(a.train) + len(a.val) == 40


def test_local_text_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 100)
    (tmp_path / "b.txt").write_text("beta " * 100)
    c = load_corpus(str(tmp_path))
    assert len(c.train) + len(c.val) == 2 and c.val
    single = load_corpus(str(tmp_path / "a.txt"))
    assert single.val[0].text and single.train[0].text
    with pytest.raises(ValueError, match="no such file"):
        load_corpus(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .txt"):
        load_corpus(str(empty))


def test_windows():
    ids = np.arange(1000, dtype=np.int32)
    w = eval_windows(ids, 100, 4)
    assert w.shape == (4, 100) and w[0, 0] == 0 and w[-1, -1] <= 999
    with pytest.raises(ValueError, match="too short"):
        check_length(ids[:10], 100, "tiny corpus")


def test_offline_corpora_are_real_text():
    shk, lee = load_corpus("shakespeare"), load_corpus("lee-news")
    assert len(shk.train) > 30 and sum(len(d.text) for d in shk.train) > 3_000_000
    assert "hamlet" in {d.title for d in shk.train + shk.val}
    assert not {d.title for d in shk.val} & {d.title for d in shk.train}
    assert len(lee.train) + len(lee.val) == 300 and "Sydney" in " ".join(d.text for d in lee.train)


def test_code_docs_and_mixtures_of_registers(tmp_path):
    code = load_corpus("python-code")
    assert "os.py" in {d.title for d in code.train + code.val} and not {d.title for d in code.val} & {
        d.title for d in code.train}
    (tmp_path / "a.txt").write_text("alpha " * 100)
    (tmp_path / "b.txt").write_text("beta " * 100)
    mix = load_corpus(f"python-code+{tmp_path}")
    assert mix.name == f"python-code+{tmp_path.name}"
    assert len(mix.train) + len(mix.val) == len(code.train) + len(code.val) + 2
    assert {d.title.split("/")[0] for d in mix.train + mix.val} == {"python-code", tmp_path.name}
    import glob

    if glob.glob("/usr/share/doc/python3*/html/_sources"):  # Debian's python3-doc (make python-docs)
        docs = load_corpus("python-docs")
        assert len(docs.train) > 100 and "library/os.rst.txt" in {d.title for d in docs.train + docs.val}
    else:
        with pytest.raises(ValueError, match="python3-doc"):
            load_corpus("python-docs")


def test_library_errors_name_arguments_and_the_cli_names_flags():
    from focusattn._errors import InputError, cli_message

    with pytest.raises(InputError) as e:
        load_corpus("./no/such/corpus")
    assert str(e.value).startswith("data='./no/such/corpus':") and "--" not in str(e.value)
    assert cli_message(e.value).startswith("--data ./no/such/corpus: not a named corpus")
    with pytest.raises(InputError, match="seq_len"):
        check_length(np.arange(10), 48, "corpus")
