"""Chained workflows that must never lose, mix up or contaminate a user's data.

Each test is one input a user hit while chaining the README's commands (pretrain → finetune →
evaluate → analyze → sweep → report, from other folders, after moving or retraining runs).
Where files are involved, the folder is snapshotted before and after: nothing the user owned is
gone or changed. CLI errors are one line on stderr with exit status 2.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from _tiny_run import snapshot, tiny_config, tiny_data, tiny_settings
from fixedhead.cli import main
from fixedhead.data import read_corpus, split_documents
from fixedhead.data.glue import glue_path
from fixedhead.runs import write_json_atomic
from fixedhead.studies.sweep import load_sweep
from fixedhead.training import DataSettings, pretrain
from fixedhead.training.finetune import FINETUNE_FILE

FT = [
    "--task",
    "sst2",
    "--max-steps",
    "2",
    "--eval-steps",
    "2",
    "--batch-size",
    "8",
    "--max-seq-length",
    "32",
    "--validation-size",
    "16",
    "--max-train-examples",
    "16",
]
pytestmark = pytest.mark.usefixtures("one_thread")


def _one_error_line(capsys) -> str:
    """The command's error: exactly one line (progress bars aside), no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fixedhead ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _last_json(out: str) -> dict:
    """The indented JSON object a command prints last (progress lines may come before it)."""
    out = "\n" + out
    return json.loads(out[out.rindex("\n{\n") + 1 :])


@pytest.fixture(scope="module")
def prepared(tiny_prepared):
    return tiny_prepared


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory) -> Path:
    """A finished 4-step pretraining run; tests copy it before touching it."""
    out = tmp_path_factory.mktemp("pre") / "run"
    pretrain(tiny_config(), prepared, out, tiny_settings(max_steps=4, save_steps=4, eval_steps=4))
    return out


@pytest.fixture
def run_copy(run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


@pytest.fixture
def glue():
    if not glue_path("sst2", "train").is_file():
        pytest.skip("shared GLUE data not found")


# ------------------------------------------------------------- 1. output folders are checked
def test_finetune_into_the_pretraining_run_is_refused(run_copy, glue, capsys):
    before = snapshot(run_copy)
    assert main(["finetune", "--model", str(run_copy), "--output-dir", str(run_copy), *FT]) == 2
    assert "pretraining run itself" in _one_error_line(capsys)
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_finetune_into_a_users_folder_touches_nothing(run_copy, glue, tmp_path, capsys, monkeypatch, overwrite):
    mine = tmp_path / "mine"
    (mine / "checkpoint-1").mkdir(parents=True)
    (mine / "checkpoint-1" / "weights.bin").write_bytes(b"user data")
    (mine / "notes.txt").write_text("my notes")
    before = snapshot(mine)
    monkeypatch.chdir(mine)
    argv = ["finetune", "--model", str(run_copy), "--output-dir", ".", *FT] + (["--overwrite"] if overwrite else [])
    assert main(argv) == 2
    err = _one_error_line(capsys)
    assert "did not create" in err and "notes.txt" in err
    assert snapshot(mine) == before


def test_overwrite_removes_only_what_finetune_wrote(run_copy, glue, tmp_path, capsys):
    out = tmp_path / "ft"
    assert main(["finetune", "--model", str(run_copy), "--output-dir", str(out), *FT]) == 0
    (out / "notes.txt").write_text("kept")
    assert (
        main(["finetune", "--model", str(run_copy), "--output-dir", str(out), *FT, "--seed", "1", "--overwrite"]) == 0
    )
    assert (out / "notes.txt").read_text() == "kept"
    assert json.loads((out / FINETUNE_FILE).read_text())["fingerprint"]["settings"]["seed"] == 1


@pytest.mark.parametrize("command", ["analyze", "bottleneck", "sweep", "report"])
def test_other_writing_commands_refuse_a_users_folder(command, run, prepared, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    before = snapshot(mine)
    text = tmp_path / "t.txt"
    text.write_text("some words to look at. " * 40)
    sweep_dir = tmp_path / "sw"
    sweep_dir.mkdir()
    write_json_atomic(sweep_dir / "sweep.json", {"meta": {}, "runs": {"x": {}}, "points": []})  # before the kit
    argv = {
        "analyze": ["analyze", str(run), "--text", str(text), "--output-dir", str(mine)],
        "bottleneck": ["bottleneck", "--n", "4", "--seeds", "0", "--output-dir", str(mine), "--no-progress"],
        "sweep": ["sweep", "--quick", "--output-dir", str(mine)],
        "report": ["report", str(sweep_dir), "--output-dir", str(mine)],
    }[command]
    assert main(argv) == 2
    assert "did not create" in _one_error_line(capsys)
    assert snapshot(mine) == before


# ----------------------------------------- 2. results are keyed on content, not on a path
def test_finetune_result_follows_the_model_not_the_folder(run, prepared, glue, tmp_path, capsys):
    src = tmp_path / "run"
    shutil.copytree(run, src)
    assert main(["finetune", "--model", str(src), *FT]) == 0
    first = json.loads((src / "finetune-sst2" / FINETUNE_FILE).read_text())
    # moved elsewhere: the same model, the same result, reused without training
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.move(str(src), moved)
    mtime = (moved / "finetune-sst2" / FINETUNE_FILE).stat().st_mtime_ns
    assert main(["finetune", "--model", str(moved), *FT]) == 0
    assert (moved / "finetune-sst2" / FINETUNE_FILE).stat().st_mtime_ns == mtime
    # retrained in place with another size: the old result is not the new model's
    pretrain(
        tiny_config(hidden_size=48, num_attention_heads=4),
        prepared,
        moved,
        tiny_settings(max_steps=4, save_steps=4, eval_steps=4),
        overwrite=True,
    )
    capsys.readouterr()
    assert main(["finetune", "--model", str(moved), *FT]) == 2
    assert "another model" in _one_error_line(capsys)
    assert main(["finetune", "--model", str(moved), *FT, "--overwrite"]) == 0
    second = json.loads((moved / "finetune-sst2" / FINETUNE_FILE).read_text())
    assert second["fingerprint"]["model"] != first["fingerprint"]["model"]


# ---------------------------------- 3. sweep results from other invocations are kept
def test_a_sweep_grown_by_a_seed_keeps_its_results(small_real_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "q"
    base = [
        "sweep",
        "--quick",
        "--corpus",
        str(small_real_corpus),
        "--output-dir",
        str(out),
        "--experiments",
        "head_size",
        "--max-steps",
        "2",
        "--skip-finetune",
        "--threads",
        "1",
    ]
    assert main(base + ["--seeds", "0"]) == 0
    assert main(base + ["--seeds", "0", "1"]) == 2  # more seeds once results exist: asked for
    assert "--grow" in _one_error_line(capsys)
    assert main(base + ["--seeds", "0", "1", "--grow"]) == 0
    state = load_sweep(out)
    assert sorted(state["runs"]) == sorted(f"{k}-s{s}" for k in ("d32-h4-dp16-fixed", "d32-h4-dp8") for s in (0, 1))
    assert state["meta"]["seeds"] == [0, 1]
    assert "seeds: [0, 1]" in (out / "report.md").read_text()
    # another corpus into the same folder would mix incomparable results: refused
    other = tmp_path / "other.txt"
    other.write_text("Other words entirely. " * 2000 + "\n")
    other2 = tmp_path / "c"
    other2.mkdir()
    shutil.copy(other, other2 / "a.txt")
    (other2 / "b.txt").write_text("And yet more words. " * 2000)
    capsys.readouterr()
    assert main(base[:3] + [str(other2)] + base[4:] + ["--seeds", "0", "1", "2", "--grow"]) == 2
    assert "run with other settings (--corpus: " in _one_error_line(capsys)


# --------------------------------------------------- 4. paths are recorded resolved
def test_corpus_path_is_recorded_resolved_and_compared_by_identity(small_real_corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, n in ((a, 60), (b, 120)):  # b's data/corpus.jsonl.gz is another corpus with the same name
        (folder / "data").mkdir(parents=True)
        with gzip.open(small_real_corpus, "rt") as src, gzip.open(folder / "data" / "corpus.jsonl.gz", "wt") as dst:
            dst.writelines(line for i, line in enumerate(src) if i < n and (folder == a or i % 2))
    args = [
        "--corpus",
        "data/corpus.jsonl.gz",
        "--vocab-size",
        "300",
        "--max-seq-length",
        "32",
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
        "--num-attention-heads",
        "4",
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--eval-steps",
        "2",
        "--save-steps",
        "2",
        "--report-to",
        "none",
        "--heldout-fraction",
        "0.1",
        "--max-eval-tokens",
        "2000",
    ]
    monkeypatch.chdir(a)
    assert main(["pretrain", "--output-dir", str(tmp_path / "run"), *args]) == 0
    recorded = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())["data"]["corpus"]
    assert recorded == str((a / "data" / "corpus.jsonl.gz").resolve())
    capsys.readouterr()
    monkeypatch.chdir(b)
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    scored_here = _last_json(capsys.readouterr().out)
    monkeypatch.chdir(a)
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    assert _last_json(capsys.readouterr().out) == scored_here  # the same held-out set from any folder
    # the same file by its absolute path resumes (it is the same corpus)
    absolute = [str(a / "data" / "corpus.jsonl.gz") if x == "data/corpus.jsonl.gz" else x for x in args]
    absolute[absolute.index("--max-steps") + 1] = "2"
    assert main(["pretrain", "--output-dir", str(tmp_path / "run"), *absolute, "--resume"]) == 0
    # a run recorded by an older version with a relative path: ambiguous, so refused with the fix
    settings = tmp_path / "run" / "pretrain_settings.json"
    old = json.loads(settings.read_text())
    old["data"]["corpus"] = "data/corpus.jsonl.gz"
    settings.write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run")]) == 2
    assert "relative path 'data/corpus.jsonl.gz'" in _one_error_line(capsys)


def test_a_corpus_whose_text_changed_is_not_the_runs(small_real_corpus, prepared, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl.gz"
    shutil.copy(small_real_corpus, corpus)
    data = tiny_data(corpus, tmp_path / "cache")
    run_dir = tmp_path / "run"
    pretrain(tiny_config(), data, run_dir, tiny_settings(max_steps=2, save_steps=2, eval_steps=2))
    assert main(["evaluate", str(run_dir)]) == 0
    capsys.readouterr()
    with gzip.open(small_real_corpus, "rt") as src, gzip.open(corpus, "wt") as dst:  # same name, other text
        dst.writelines(line for i, line in enumerate(src) if i % 3)
    assert main(["evaluate", str(run_dir)]) == 2
    assert "does not hold the text" in _one_error_line(capsys)


# ------------------------------------------- 5. numbers are validated by every command
@pytest.mark.parametrize(
    "argv, message",
    [
        (["finetune", "--max-steps", "0"], "--max-steps must be a positive int, got 0"),
        (["finetune", "--max-steps", "-1"], "--max-steps must be a positive int, got -1"),
        (["finetune", "--max-train-examples", "0"], "--max-train-examples must be a positive int, got 0"),
        (["finetune", "--validation-size", "0"], "--validation-size must be a positive int, got 0"),
        (["finetune", "--max-seq-length", "2"], "--max-seq-length must be an int >= 8, got 2"),
        (["finetune", "--learning-rate", "nan"], "--learning-rate must be a positive finite number, got nan"),
        (["pretrain", "--max-train-tokens", "-5"], "--max-train-tokens must be an int >= 64, got -5"),
        (["pretrain", "--max-eval-tokens", "0"], "--max-eval-tokens must be an int >= 64, got 0"),
        (["pretrain", "--heldout-fraction", "1.5"], "--heldout-fraction must be in (0, 1), got 1.5"),
        (["pretrain", "--seed", "-3"], "--seed must be an int >= 0, got -3"),
        (["evaluate", "--max-eval-tokens", "0"], "--max-eval-tokens must be an int >= 32, got 0"),  # the run's n
        (["analyze", "--max-sequences", "0"], "--max-sequences must be a positive int, got 0"),
        (["evaluate", "--eval-seed", "-1"], "--eval-seed must be an int >= 0, got -1"),
        (["sweep", "--seeds", "0", "-1"], "--seeds must be an int >= 0, got -1"),
        (["sweep", "--threads", "0"], "--threads must be a positive int, got 0"),
        (["compare", "--max-steps", "0"], "--steps must be a positive int, got 0"),
    ],
)
def test_cli_numbers_are_refused_naming_the_value(argv, message, run, tmp_path, capsys):
    command, rest = argv[0], argv[1:]
    text = tmp_path / "t.txt"
    text.write_text("words " * 100)
    base = {
        "finetune": ["finetune", "--task", "sst2", "--model", str(run), "--output-dir", str(tmp_path / "o")],
        "pretrain": ["pretrain", "--output-dir", str(tmp_path / "o")],
        "evaluate": ["evaluate", str(run)],
        "analyze": ["analyze", str(run), "--text", str(text), "--output-dir", str(tmp_path / "o")],
        "sweep": ["sweep", "--quick", "--output-dir", str(tmp_path / "o")],
        "compare": ["compare", "--preset", "tiny", "--output-dir", str(tmp_path / "o")],
    }[command]
    assert main(base + rest) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_validation_size_is_never_changed_silently(run_copy, glue, tmp_path, capsys):
    rte = glue_path("rte", "train")
    if not rte.is_file():
        pytest.skip("RTE not found")
    argv = [
        "finetune",
        "--task",
        "rte",
        "--model",
        str(run_copy),
        "--output-dir",
        str(tmp_path / "o"),
        "--max-steps",
        "1",
        "--eval-steps",
        "1",
        "--batch-size",
        "4",
        "--max-seq-length",
        "32",
        "--max-train-examples",
        "8",
    ]
    assert main(argv + ["--validation-size", "5000"]) == 2
    assert "--validation-size must be in [1, 2489] for 2490 training examples, got 5000" in _one_error_line(capsys)
    # the default is 1,000 or a fifth of GLUE train, and the result says which it was
    assert main(argv) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["validation_examples"] == result["validation_size"] == 2490 // 5


# ---------------------------------------------------- 6. one way to open a run
@pytest.mark.parametrize("damage", ["truncated weights", "broken config", "pickle weights", "a BERT checkpoint"])
@pytest.mark.parametrize("command", ["finetune", "analyze", "evaluate"])
def test_every_command_checks_a_run_before_loading_it(damage, command, run_copy, tmp_path, capsys):
    if damage == "truncated weights":
        w = run_copy / "model.safetensors"
        w.write_bytes(w.read_bytes()[:1000])
        expected = "truncated or corrupt"
    elif damage == "broken config":
        c = run_copy / "config.json"
        c.write_text(c.read_text()[:40])
        expected = "config.json is not valid JSON"
    elif damage == "pickle weights":
        import torch
        from safetensors.torch import load_file

        torch.save(load_file(run_copy / "model.safetensors"), run_copy / "pytorch_model.bin")
        (run_copy / "model.safetensors").unlink()
        expected = "pickle weights"
    else:
        from transformers import BertConfig, BertForMaskedLM

        shutil.rmtree(run_copy)
        BertForMaskedLM(
            BertConfig(
                vocab_size=400,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=32,
            )
        ).save_pretrained(run_copy)
        expected = "model_type is 'bert', expected 'fixedhead'"
        if command == "analyze":
            pytest.skip("analyze reads transformers BERT checkpoints on purpose")
    text = tmp_path / "t.txt"
    text.write_text("words " * 100)
    argv = {
        "finetune": ["finetune", "--task", "sst2", "--model", str(run_copy), "--output-dir", str(tmp_path / "o")],
        "analyze": ["analyze", str(run_copy), "--text", str(text), "--output-dir", str(tmp_path / "o")],
        "evaluate": ["evaluate", str(run_copy)],
    }[command]
    before = snapshot(run_copy)
    assert main(argv) == 2
    assert expected in _one_error_line(capsys)
    assert snapshot(run_copy) == before and not (tmp_path / "o").exists()


# ----------------------------------------------- 7. file-system errors are one line
def test_a_full_disk_during_analyze_leaves_all_outputs_or_none(run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("some words to look at, and some more words. " * 40)
    out = tmp_path / "out"
    # a file-size limit: writes beyond it fail with EFBIG (Python ignores SIGXFSZ), as on a full disk
    # the limit is set after the imports (a first matplotlib import may write its font cache)
    driver = (
        "import resource, sys; import matplotlib.pyplot; from fixedhead.cli import main; "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000)); sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            driver,
            "analyze",
            str(run),
            "--text",
            str(text),
            "--output-dir",
            str(out),
            "--max-sequences",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [line for line in proc.stderr.splitlines() if line.startswith("fixedhead ")]
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "File too large" in err[0] and str(out) in err[0]
    assert sorted(p.name for p in out.iterdir()) == []  # neither analysis.json nor the heatmap


@pytest.mark.parametrize("command", ["finetune", "analyze", "pretrain"])
def test_a_read_only_folder_is_one_line(command, run, glue, prepared, small_real_corpus, tmp_path, capsys, monkeypatch):
    # tests may run as root, for whom chmod does not make a folder read-only: the file system's
    # answer is simulated where every command creates its files and folders
    target = tmp_path / "ro"

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(target))

    import pathlib
    import tempfile

    real_mkdir = pathlib.Path.mkdir
    monkeypatch.setattr(
        pathlib.Path,
        "mkdir",
        lambda self, *a, **k: refuse() if str(self).startswith(str(target)) else real_mkdir(self, *a, **k),
    )
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    text = tmp_path / "t.txt"
    text.write_text("words " * 100)
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    argv = {
        "finetune": ["finetune", "--model", str(run), "--output-dir", str(target), *FT],
        "analyze": ["analyze", str(run), "--text", str(text), "--output-dir", str(target)],
        "pretrain": [
            "pretrain",
            "--output-dir",
            str(target),
            "--corpus",
            str(small_real_corpus),
            "--vocab-size",
            "300",
            "--max-seq-length",
            "32",
            "--hidden-size",
            "32",
            "--num-hidden-layers",
            "1",
            "--max-steps",
            "1",
            "--report-to",
            "none",
        ],
    }[command]
    assert main(argv) == 2
    err = _one_error_line(capsys)
    assert "Read-only file system" in err and str(target) in err


# ------------------------------------------------------------ 8. the corpus walk
def test_corpus_walk_skips_hidden_folders_and_never_trains_on_heldout_text(tmp_path):
    folder = tmp_path / "corpus"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    lines = "".join(json.dumps({"title": f"t{i}", "text": f"document number {i} " * 5}) + "\n" for i in range(200))
    (folder / "wiki.jsonl").write_text(lines)
    (folder / ".ipynb_checkpoints" / "wiki-checkpoint.jsonl").write_text(lines)
    (folder / ".hidden.txt").write_text("a hidden file")
    assert len(read_corpus(folder)) == 200
    # a visible copy: exact duplicates are kept once, so no held-out text is also in training
    (folder / "wiki_copy.jsonl").write_text(lines)
    docs = read_corpus(folder)
    assert len(docs) == 400
    train, held = split_documents(docs, 0.1, seed=0)
    assert len(train) + len(held) == 200 and len(held) == 20
    assert not {d.text for d in held} & {d.text for d in train}


def test_a_byte_order_mark_is_not_text(tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes("\ufeff".encode() + "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3)).encode())
    assert [d.text for d in read_corpus(f)] == ["doc 0", "doc 1", "doc 2"]
    t = tmp_path / "dir"
    t.mkdir()
    shutil.copy(f, t / "a.jsonl")
    (t / "b.txt").write_bytes("\ufeffplain text".encode())
    assert [d.text for d in read_corpus(t)] == ["doc 0", "doc 1", "doc 2", "plain text"]


def test_data_settings_need_a_corpus():
    with pytest.raises(ValueError, match="DataSettings needs a corpus"):
        DataSettings()


# ------------------------------------------------------- 9. files follow the umask
@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_run_files_and_caches_follow_the_umask(umask, file_mode, dir_mode, small_real_corpus, tmp_path):
    from fixedhead.data import train_tokenizer

    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "m.json", {"a": 1})
        train_tokenizer(["some text to learn a tokenizer from " * 20], vocab_size=120, cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == file_mode
    (entry,) = list((tmp_path / "cache").iterdir())
    assert stat.S_IMODE(entry.stat().st_mode) == dir_mode
    assert stat.S_IMODE((entry / "tokenizer.json").stat().st_mode) == file_mode


def test_pretrain_outputs_follow_the_umask(run):
    for name in ("metrics.json", "pretrain_settings.json"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o666 & ~_umask(), name


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


# ---------------------------------------------------------- smaller, same kinds
def test_malformed_files_are_named(run, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    assert main(["analyze", str(run), "--text", str(bad), "--output-dir", str(tmp_path / "o")]) == 2
    assert f"{bad}:2: not valid JSON" in _one_error_line(capsys)
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "sweep.json").write_text('{"meta": {"preset": "cpu"}, "runs": {"a"')
    assert main(["report", str(sweep)]) == 2
    assert f"{sweep / 'sweep.json'} is not valid JSON" in _one_error_line(capsys)


# ------------------------------------------------- found by a review that followed the README
def test_review_findings_widen_finetune_resume_permissions(run, prepared, glue, tmp_path, capsys):
    from fixedhead.training import load_run
    from fixedhead.training import pretrain as pretrain_fn

    # widening into the run itself, or over an earlier widen output without --overwrite, is refused
    assert main(["widen", str(run), "--head-dim", "32", "--output-dir", str(run)]) == 2
    assert "is the run being widened" in _one_error_line(capsys)
    out = tmp_path / "wide"
    assert main(["widen", str(run), "--head-dim", "32", "--output-dir", str(out)]) == 0
    before = snapshot(out)
    assert main(["widen", str(run), "--head-dim", "48", "--output-dir", str(out)]) == 2
    assert "pass --overwrite" in _one_error_line(capsys) and snapshot(out) == before
    assert main(["widen", str(run), "--head-dim", "32", "--seed", "-1", "--output-dir", str(tmp_path / "w")]) == 2
    assert "--seed must be an int >= 0, got -1" in _one_error_line(capsys)
    # the widened run keeps its source's data settings: evaluate scores the same held-out set
    assert main(["evaluate", str(out)]) == 0
    assert main(["evaluate", str(run)]) == 0
    # safetensors writes 0600; run files follow the umask
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~_umask()
    assert stat.S_IMODE((run / "model.safetensors").stat().st_mode) == 0o666 & ~_umask()
    # a fine-tuned classifier is not a pretraining run: widen refuses it rather than drop its classifier
    ft = tmp_path / "ft"
    assert main(["finetune", "--model", str(run), "--output-dir", str(ft), *FT]) == 0
    capsys.readouterr()
    assert main(["widen", str(ft), "--head-dim", "32", "--output-dir", str(tmp_path / "w2")]) == 2
    assert "FixedHeadForSequenceClassification" in _one_error_line(capsys)
    # resuming a finished run returns its metrics: no extra step, no new checkpoint
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    checkpoints = sorted(p.name for p in resumed.glob("checkpoint-*"))
    model, _, _ = load_run(resumed)
    result = pretrain_fn(
        tiny_config(), prepared, resumed, tiny_settings(max_steps=4, save_steps=4, eval_steps=4), resume=True
    )
    assert sorted(p.name for p in resumed.glob("checkpoint-*")) == checkpoints
    assert result == json.loads((run / "metrics.json").read_text())


def test_causal_runs_are_not_fine_tuned_and_usage_errors_are_one_line(clm_tiny_run, glue, tmp_path, capsys):
    assert main(["finetune", "--model", str(clm_tiny_run), "--output-dir", str(tmp_path / "ft"), *FT]) == 2
    assert "is a causal LM" in _one_error_line(capsys)
    assert not (tmp_path / "ft").exists()
    with pytest.raises(SystemExit) as info:
        main(["pretrain", "--objective", "xyz"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "invalid choice: 'xyz'" in err


@pytest.fixture(scope="module")
def clm_tiny_run(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clm") / "run"
    pretrain(tiny_config(), prepared, out, tiny_settings(max_steps=2, save_steps=2, eval_steps=2, objective="clm"))
    return out


def test_invocation_commands_keep_every_distinct_command_in_order(monkeypatch):
    from fixedhead.runs import invocation_commands

    previous = {"commands": ["fixedhead sweep --seeds 0 1", "fixedhead sweep --seeds 1 0"]}
    assert invocation_commands("fixedhead sweep --seeds 0 1", previous) == (
        "fixedhead sweep --seeds 0 1",
        ["fixedhead sweep --seeds 0 1", "fixedhead sweep --seeds 1 0"],
    )
    assert invocation_commands("x", {}) == ("x", ["x"])
    monkeypatch.setattr("sys.argv", ["fixedhead", "sweep", "--output-dir", "a b"])
    assert invocation_commands(None, {})[0] == "fixedhead sweep --output-dir 'a b'"
