"""fixedhead.experiments.compare (``fixedhead compare``): the tiny preset end to end, and what it
refuses before any work."""

import json

from fixedhead.cli import main


def test_compare_tiny_writes_table_and_files(small_real_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    rc = main(
        [
            "compare",
            "--preset",
            "tiny",
            "--corpus",
            str(small_real_corpus),
            "--output-dir",
            str(tmp_path / "c"),
            "--max-steps",
            "6",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "held-out ppl" in out and "standard-wide" in out
    results = json.loads((tmp_path / "c" / "results.json").read_text())["results"]
    assert [r["name"] for r in results] == ["standard", "fixed", "standard-wide"]
    assert results[1]["head_dim"] == 16 and results[0]["head_dim"] == 4
    # the wide model is parameter-matched to the fixed one (at least as big, within one step of width)
    assert results[2]["parameters"] >= results[1]["parameters"]
    assert (tmp_path / "c" / "learning_curves.png").stat().st_size > 1000
    assert (tmp_path / "c" / "results.csv").read_text().count("\n") == 4


def test_missing_default_corpus_message(tmp_path, monkeypatch, capsys):
    import fixedhead.experiments.compare as compare

    monkeypatch.setattr(compare, "DEFAULT_CORPUS", tmp_path / "nowhere.jsonl.gz")
    preset = compare.get_compare_preset("tiny")
    preset.data.corpus = str(tmp_path / "nowhere.jsonl.gz")
    monkeypatch.setattr(compare, "get_compare_preset", lambda name: preset)
    rc = main(["compare", "--preset", "tiny", "--output-dir", str(tmp_path / "c")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--corpus PATH" in err and "Traceback" not in err


def test_compare_refuses_foreign_output_dir_and_zero_steps(tmp_path, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["compare", "--preset", "tiny", "--output-dir", str(tmp_path / "busy")]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    assert main(["compare", "--preset", "tiny", "--max-steps", "0", "--output-dir", str(tmp_path / "z")]) == 2
    assert "max_steps" in capsys.readouterr().err
