"""fixedhead.studies.compare (``fixedhead compare``): the tiny preset end to end, and what it
refuses before any work."""

import json

import pytest

from fixedhead.cli import main
from fixedhead.studies.kit.study import run_study


def test_compare_tiny_writes_table_and_files(small_real_corpus, tmp_path, monkeypatch):
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
    saved = json.loads((tmp_path / "c" / "results.json").read_text())
    results = list(saved["runs"].values())
    assert all(0 < r["heldout_bits_per_character"] < 10 for r in results)
    # one tokenizer for every model, recorded beside the corpus, with the versions that trained them
    tokenizer = results[0]["data_info"]["tokenizer_sha256"]
    assert len(tokenizer) == 64 and results[0]["data_info"]["corpus_sha256"]
    assert {r["reproducibility"]["tokenizer_sha256"] for r in results} == {tokenizer}
    assert saved["meta"]["other_versions"]["accelerate"]
    assert [r["heldout_perplexity"] for r in saved["summary"]] == [r["heldout_perplexity"] for r in results]
    assert (tmp_path / "c" / "report.md").read_text().count("| standard") == 2  # the table and standard-wide
    assert saved["meta"]["command"].startswith("fixedhead compare --preset tiny --corpus ")
    assert [r["name"] for r in results] == ["standard", "fixed", "standard-wide"]
    assert results[1]["head_dim"] == 16 and results[0]["head_dim"] == 4
    # the wide model is parameter-matched to the fixed one (at least as big, within one step of width)
    assert results[2]["parameters"] >= results[1]["parameters"]
    assert (tmp_path / "c" / "learning_curves.png").stat().st_size > 1000
    assert (tmp_path / "c" / "results.csv").read_text().count("\n") == 4


def test_table_and_csv_show_bits_per_character_and_a_dash_for_older_results(tmp_path):
    import csv
    import math

    from fixedhead.studies.compare import format_table, write_results

    base = dict(
        hidden_size=32,
        num_attention_heads=4,
        head_dim=8,
        parameters=1000,
        training_tokens=640,
        heldout_perplexity=100.0,
        heldout_loss=math.log(100.0),
        heldout_accuracy=0.1,
        train_seconds=3.0,
        fixed_head=False,
        num_hidden_layers=1,
        tokens_per_step=64,
        train_curve=[(1, 5.0)],
        eval_curve=[(1, 5.1)],
    )
    new = dict(base, name="new", heldout_bits_per_character=1.23456)
    old = dict(base, name="old")  # a results file from before bits per character was measured
    lines = format_table([new, old], unigram_perplexity=200.0).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    column = header.index("bits/char")
    assert header[column - 1] == "held-out ppl"
    assert [c.strip() for c in lines[2].strip("|").split("|")][column - 1 : column + 1] == ["100.00", "1.235"]
    assert [c.strip() for c in lines[3].strip("|").split("|")][column - 1 : column + 1] == ["100.00", "-"]
    write_results([new, old], tmp_path, {"description": "test"})
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["heldout_bits_per_character"] for r in rows] == ["1.23456", ""]


def test_missing_default_corpus_message(tmp_path, monkeypatch, capsys):

    from fixedhead.studies.kit import recipes

    recipe = recipes.get_recipe("tiny")
    recipe.data.corpus = str(tmp_path / "nowhere.jsonl.gz")
    monkeypatch.setitem(recipes.RECIPES, "tiny", lambda: recipe)
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
    assert "--steps must be a positive int, got 0" in capsys.readouterr().err
    # a rate and a grid: the grid would silently win; refused before any work
    argv = ["compare", "--preset", "tiny", "--learning-rate", "5e-4", "--learning-rates", "1e-3,2e-3"]
    assert main([*argv, "--output-dir", str(tmp_path / "g")]) == 2
    assert "--learning-rate = 0.0005" in capsys.readouterr().err and not (tmp_path / "g").exists()
    # another study's results.json (farthest-point writes one too): not compare's folder
    (tmp_path / "fp").mkdir()
    (tmp_path / "fp" / "results.json").write_text('{"meta": {"study": "farthest-point"}, "runs": {}}')
    assert main(["compare", "--preset", "tiny", "--output-dir", str(tmp_path / "fp")]) == 2
    assert "fixedhead farthest-point" in capsys.readouterr().err


def test_make_run_preset_is_causal_at_the_causal_threshold_and_the_masked_one_a_preset_away():
    """`make run` (preset cpu) compares causal LMs whose fixed head size is the causal threshold
    ceil((n - 1)/2) (docs/theory.md) with standard heads of d/h = 8; cpu-mlm keeps the masked
    comparison at fixed d_p = n with the 40% masking recipe; switching objective drops the
    masking rate rather than refusing (a causal LM has none; next test)."""
    import math

    from fixedhead.model.configuration import FixedHeadConfig
    from fixedhead.studies.compare import CompareOptions, spec

    cpu = spec(CompareOptions(preset="cpu"))
    n = cpu.data.max_seq_length
    assert cpu.train.objective == "clm" and n == 64
    assert cpu.configs["fixed"]["head_dim"] == math.ceil((n - 1) / 2)
    assert FixedHeadConfig(**cpu.configs["standard"]).attention_head_size == 128 // 16 < n // 4
    masked = spec(CompareOptions(preset="cpu-mlm"))
    assert masked.train.objective == "mlm" and masked.train.mlm_probability == 0.4
    assert masked.configs["fixed"]["head_dim"] == masked.data.max_seq_length


def test_compare_objective_switch_on_the_masked_preset(small_real_corpus, tmp_path, monkeypatch):
    import fixedhead.studies.compare as compare

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    from dataclasses import replace

    from fixedhead.studies.kit import recipes

    tiny = recipes.get_recipe("tiny")
    tiny = replace(tiny, train=replace(tiny.train, mlm_probability=0.4))
    monkeypatch.setitem(recipes.RECIPES, "tiny", lambda: tiny)
    options = compare.CompareOptions(preset="tiny", corpus=str(small_real_corpus), steps=2, objective="clm")
    record = run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    assert {r["objective"] for r in record["runs"].values()} == {"clm"}
    assert "trained as clm instead of the preset's mlm" in record["meta"]["description"]


def test_each_model_chooses_its_learning_rate_on_the_validation_split(small_real_corpus, tmp_path, monkeypatch):
    import math

    import fixedhead.studies.compare as compare
    from fixedhead.studies.kit.learning_rate import VALIDATION_FRACTION

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    options = compare.CompareOptions(
        preset="tiny", corpus=str(small_real_corpus), steps=3, learning_rates=(1e-3, 4e-3), max_extensions=1
    )
    record = run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    results = list(record["runs"].values())
    state = compare.state_of(compare.CompareStudy().resolve(options), results, record["meta"])
    selection = state["meta"]["learning_rate_selection"]
    assert state["meta"]["data"]["validation_fraction"] == VALIDATION_FRACTION
    for r in results:
        chosen = selection["models"][r["name"]]
        losses = {float(lr): v for lr, v in chosen["validation_loss"].items()}
        assert {1e-3, 4e-3} <= set(losses) and len(losses) <= 3  # the grid, at most one extension
        # the choice is the lowest validation loss; the result reported is that run's held-out score
        assert chosen["chosen"] == r["learning_rate"] == min(losses, key=lambda lr: losses[lr])
        assert r["heldout_loss"] == chosen["heldout_loss"][f"{r['learning_rate']:g}"]
        assert math.isfinite(r["validation_loss"]) and r["validation_loss"] != r["heldout_loss"]
        metrics = json.loads(
            (tmp_path / "c" / "lr-grid" / f"{r['name']}-lr{r['learning_rate']:g}" / "metrics.json").read_text()
        )
        assert metrics["validation_loss"] == losses[r["learning_rate"]]
    assert (tmp_path / "c" / "learning_rates.png").read_bytes()[:4] == b"\x89PNG"
    assert "learning_rate" in (tmp_path / "c" / "results.csv").read_text().splitlines()[0].split(",")
    # the same command again trains nothing: every run of the grid is reused
    again = run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    assert [r["train_seconds"] for r in again["runs"].values()] == [r["train_seconds"] for r in results]


def test_compare_writes_its_plan_before_training(small_real_corpus, tmp_path, monkeypatch):
    """The models, each one's rate and the seed are in results.json before the first step: an
    interrupted comparison shows what it was going to do, and nothing can be decided after seeing results."""
    from fixedhead.studies import compare

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compare, "train_or_reuse", interrupted)
    out = tmp_path / "c"
    argv = ["compare", "--preset", "tiny", "--corpus", str(small_real_corpus), "--output-dir", str(out)]
    assert main(argv) == 130
    assert not (out / "results.json").is_file() or not json.loads((out / "results.json").read_text())["runs"]
    plan = json.loads((out / "plan.json").read_text())["plan"]
    assert plan["points"] == ["standard", "fixed", "standard-wide"]
    assert plan["models"]["fixed"]["head_dim"] == 16
    assert plan["rates"] == {name: 3e-3 for name in plan["models"]}  # the tiny recipe's rate
    # the widened model keeps the preset's feed-forward ratio (tiny: 64 for d = 32), sized once the
    # tokenizer is trained; --models trains a subset, the widened model still sized against the fixed one
    monkeypatch.setattr(
        compare,
        "train_or_reuse",
        lambda config, *a, **k: (_ for _ in ()).throw(RuntimeError(f"{config.hidden_size} {config.intermediate_size}")),
    )
    wide = tmp_path / "w"
    argv = ["compare", "--preset", "tiny", "--corpus", str(small_real_corpus), "--output-dir", str(wide)]
    with pytest.raises(RuntimeError) as sized:
        run_study(
            compare.CompareStudy(),
            compare.CompareOptions(preset="tiny", corpus=str(small_real_corpus), models=("standard-wide",)),
            wide,
            progress=False,
        )
    d, f = map(int, str(sized.value).split())
    assert d > 32 and f == 2 * d
    assert json.loads((wide / "plan.json").read_text())["plan"]["points"] == ["standard-wide"]
    assert main([*argv, "--models", "fixd"]) == 2


def test_compare_tiny_as_llama_trains_transformers_llama_models(small_real_corpus, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    common = ["compare", "--preset", "tiny", "--corpus", str(small_real_corpus), "--architecture", "llama"]
    out = tmp_path / "c"
    # the tiny preset is masked: a Llama model is causal only, refused before any work
    assert main([*common, "--output-dir", str(out)]) == 2
    assert "architecture 'llama' trains causal LMs only; got objective 'mlm'" in capsys.readouterr().err
    assert not out.exists()
    assert main([*common, "--objective", "clm", "--output-dir", str(out), "--max-steps", "4", "--no-progress"]) == 0
    saved = json.loads((out / "results.json").read_text())
    results = saved["runs"]
    assert "LlamaForCausalLM" in saved["meta"]["description"]
    for name, head_dim in (("standard", 4), ("fixed", 16), ("standard-wide", None)):
        config = json.loads((out / name / "config.json").read_text())
        assert config["model_type"] == "llama" and results[name]["architecture"] == "llama"
        # standard heads: d/h, an even number for every width tried (rotary heads need pairs)
        assert config["head_dim"] == (head_dim or config["hidden_size"] // config["num_attention_heads"])
        assert config["head_dim"] % 2 == 0 and results[name]["head_dim"] == config["head_dim"]
        model = AutoModelForCausalLM.from_pretrained(str(out / name))
        assert results[name]["parameters"] == sum(p.numel() for p in model.parameters())
        assert results[name]["samples"]
    assert results["standard-wide"]["parameters"] >= results["fixed"]["parameters"]


def test_cpu_llama_preset_is_the_cpu_question_for_llama_and_refusals(tmp_path):
    from dataclasses import replace

    from fixedhead.studies.compare import CompareOptions, CompareStudy, match_hidden_size, spec
    from fixedhead.studies.kit.recipes import get_recipe

    cpu, llama = spec(CompareOptions(preset="cpu")), spec(CompareOptions(preset="cpu-llama"))
    assert {name: {**fields, "architecture": "llama"} for name, fields in cpu.configs.items()} == llama.configs
    # the same recipe; the rates chosen for fixedhead's models (and their validation split) are not Llama's
    assert llama.train == cpu.train
    assert llama.data == get_recipe("cpu-clm").data and not llama.comparison.learning_rates
    assert cpu.data == replace(get_recipe("cpu-clm").data, validation_fraction=0.05)
    # the wider standard Llama model: the smallest d (a multiple of 2h = 32) with at least the fixed
    # model's parameters, counted with the formula of tests/model/test_architectures.py
    v, layers, h = 8192, 2, 16

    def params(d, i, f):
        return v * d + layers * (4 * d * i + 3 * d * f + 2 * d) + d

    target = params(128, 16 * 32, 512)
    d = match_hidden_size(llama.configs["standard-wide"], target, v)
    assert d % (2 * h) == 0 and params(d, d, 4 * d) >= target > params(d - 2 * h, d - 2 * h, 4 * (d - 2 * h))
    with pytest.raises(ValueError, match="parametrization='mup' is an option of fixedhead's attention only"):
        run_study(
            CompareStudy(), CompareOptions(preset="cpu-mup", architecture="llama"), tmp_path / "m", progress=False
        )
    assert not (tmp_path / "m").exists()


def test_a_preset_with_each_models_rate_trains_them_there_without_the_validation_split(
    small_real_corpus, tmp_path, monkeypatch
):
    """Rates chosen on the validation split stay valid only if the models train as they did when
    the rates were chosen: without that split."""
    from fixedhead.studies import compare

    seen = {}

    def record(config, data, run_dir, settings, overwrite=False):
        seen[run_dir.name] = (settings.learning_rate, data.validation is not None)
        raise KeyboardInterrupt

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compare, "train_or_reuse", record)
    rates = {"standard": 1e-3, "fixed": 4e-3, "standard-wide": 2e-3}  # a preset's rates are options too
    options = compare.CompareOptions(
        preset="tiny", corpus=str(small_real_corpus), model_learning_rates=tuple(rates.values())
    )
    with pytest.raises(KeyboardInterrupt):
        run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    assert seen == {"standard": (1e-3, True)}
    assert json.loads((tmp_path / "c" / "plan.json").read_text())["plan"]["rates"] == rates
    assert compare.spec(options).data.validation_fraction == 0.05


def test_a_rate_grid_records_a_diverged_rate_and_chooses_among_the_others(small_real_corpus, tmp_path, monkeypatch):
    import fixedhead.studies.compare as compare
    from fixedhead.studies.kit.study import run_study

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    options = compare.CompareOptions(
        preset="tiny", corpus=str(small_real_corpus), steps=10, learning_rates=(1e-3, 10.0), max_extensions=0
    )
    record = run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    selection = compare.state_of(compare.spec(options), list(record["runs"].values()), record["meta"])["meta"][
        "learning_rate_selection"
    ]
    for r in record["runs"].values():
        chosen = selection["models"][r["name"]]
        assert chosen["validation_loss"]["10"] is None  # diverged, recorded as such
        assert r["learning_rate"] == chosen["chosen"] == 1e-3
    # a rerun finishes with the same record, training nothing again
    again = run_study(compare.CompareStudy(), options, tmp_path / "c", progress=False)
    assert [r["train_seconds"] for r in again["runs"].values()] == [r["train_seconds"] for r in record["runs"].values()]
