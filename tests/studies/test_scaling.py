"""fixedhead.studies.scaling (``fixedhead scaling``): the families' head sizes, the parameter and
FLOP counts against independent references, the fits, and the tiny preset end to end."""

import json
import math
from dataclasses import replace

import pytest

from fixedhead.cli import main
from fixedhead.model.sizes import non_embedding_parameters
from fixedhead.studies import scaling
from fixedhead.studies.kit.recipes import get_recipe
from fixedhead.studies.kit.study import regenerate, run_study
from fixedhead.studies.scaling import report as scaling_report


def test_each_family_takes_the_papers_head_size():
    assert scaling.family_head_dim("standard", "clm", 64) is None
    assert scaling.family_head_dim("threshold", "mlm", 32) == 32  # Theorem 2: d_p = n
    assert scaling.family_head_dim("threshold", "clm", 64) == math.ceil(63 / 2)  # the causal threshold
    assert scaling.family_head_dim("d_p=64", "clm", 64) == 64
    with pytest.raises(ValueError, match="unknown head-size family 'd_p=0'"):
        scaling.family_head_dim("d_p=0", "clm", 64)
    with pytest.raises(ValueError, match="hidden_size 100 is not a multiple of num_attention_heads 16"):
        scaling.spec(scaling.ScalingOptions(preset="tiny", hidden_sizes=(100, 128), num_attention_heads=(16, 16)))
    with pytest.raises(ValueError, match="at least 2 sizes"):
        scaling.spec(scaling.ScalingOptions(preset="tiny", hidden_sizes=(128,), num_attention_heads=(16,)))
    with pytest.raises(ValueError, match="give one head count per hidden size"):
        scaling.spec(scaling.ScalingOptions(preset="tiny", hidden_sizes=(64, 128, 256)))  # the preset's 2 head counts


def test_a_preset_is_the_options_it_starts_from_and_given_options_override_it():
    tiny = scaling.spec(scaling.ScalingOptions(preset="tiny"))
    assert tiny == scaling.PRESETS["tiny"]
    wider = scaling.spec(scaling.ScalingOptions(preset="tiny", hidden_sizes=(16, 64), num_attention_heads=(2, 8)))
    assert wider == replace(tiny, hidden_sizes=(16, 64), num_attention_heads=(2, 8))
    assert [pt["hidden_size"] for pt in scaling.points_of(wider)] == [16, 64, 16, 64]


def test_non_embedding_parameters_are_berts_without_its_embeddings():
    """A standard-head masked LM is BERT's: the count equals transformers' BertForMaskedLM's
    parameters minus its word, position and type embeddings."""
    from transformers import BertConfig, BertForMaskedLM

    from fixedhead.model.configuration import FixedHeadConfig

    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=500)
    bert = BertForMaskedLM(BertConfig(**sizes, max_position_embeddings=32))
    emb = bert.bert.embeddings
    expected = sum(p.numel() for p in bert.parameters()) - sum(
        m.weight.numel() for m in (emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings)
    )
    assert non_embedding_parameters(FixedHeadConfig(**sizes, max_position_embeddings=32)) == expected
    # a fixed head of 32 (4 heads): q, k, v grow to 4*32 outputs, W_o to 4*32 inputs
    fixed = non_embedding_parameters(FixedHeadConfig(**sizes, max_position_embeddings=32, head_dim=32))
    assert fixed - expected == 2 * (3 * 64 * (128 - 64) + 3 * (128 - 64) + 64 * (128 - 64))


def test_flops_power_law_and_holm_against_hand_computed_values():
    from fixedhead.studies.kit.stats import holm

    assert scaling.training_flops(1000, 10, 2, 8, 16) == 6 * 10 * (1000 + 2 * 8 * 16)
    a, b = scaling_report.power_law([10, 100, 1000], [3 * 10**-0.1, 3 * 100**-0.1, 3 * 1000**-0.1])
    assert a == pytest.approx(3) and b == pytest.approx(0.1)
    # Holm: sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([0.2, float("nan")])[1]) and holm([0.2, float("nan")])[0] == pytest.approx(0.2)


def test_only_runs_at_a_chosen_rate_are_results():
    run = lambda point, lr, seed: {"point": point, "learning_rate": lr, "seed": seed}  # noqa: E731
    state = {
        "meta": {"plan": {"learning_rates": [1e-3, 2e-3]}},
        "tuning": {"a": {"chosen": 2e-3}},
        "runs": {
            "a1": run("a", 1e-3, 0),
            "a2": run("a", 2e-3, 1),
            "a3": run("a", 2e-3, 0),
            "b1": run("b", 1e-3, 0),  # b is still choosing its rate: its grid runs are no result yet
        },
    }
    assert scaling_report.chosen_rows(state) == {"a": [run("a", 2e-3, 0), run("a", 2e-3, 1)]}


def test_scaling_tiny_end_to_end(small_real_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "s"
    argv = ["scaling", "--preset", "tiny", "--corpus", str(small_real_corpus), "--output-dir", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    record = json.loads((out / "results.json").read_text())
    plan = json.loads((out / "plan.json").read_text())["plan"]
    # seed-major: every point's first seed before any second seed
    assert plan["points"] == [
        f"{k}-s{s}" for s in (0, 1) for k in ("standard-d16", "standard-d32", "threshold-d16", "threshold-d32")
    ]
    assert plan["options"]["preset"] == "tiny" and record["missing"] == []
    state = scaling.state_of(scaling.spec(scaling.ScalingStudy.quick), record["runs"].values(), record["meta"])
    assert state["meta"]["plan"]["seeds"] == [0, 1] and state["meta"]["plan"]["learning_rates"] == [0.002, 0.004]
    # seed 0 at both rates per point, seed 1 at the chosen one
    assert len(state["runs"]) == 4 * 3
    for key, tuning in state["tuning"].items():
        chosen = tuning["chosen"]
        losses = {float(lr): v for lr, v in tuning["validation_loss"].items()}
        assert chosen == min(losses, key=losses.get)
        seeds = sorted(r["seed"] for r in state["runs"].values() if r["point"] == key and r["learning_rate"] == chosen)
        assert seeds == [0, 1] and record["runs"][f"{key}-s1"]["learning_rate"] == chosen
    # each run trains (tokens per parameter x N, at least min_steps steps) and is a model of its family
    runs = {r["point"]: r for r in state["runs"].values()}
    assert runs["threshold-d32"]["head_dim"] == 32 and runs["standard-d32"]["head_dim"] == 8
    assert runs["standard-d16"]["training_tokens"] == 4 * 16 * 32  # min_steps x batch x n
    assert (out / "scaling.png").stat().st_size > 1000
    # every point's first-seed run at its chosen rate has its heads' ranks, below their ceiling
    n = state["meta"]["n"]
    assert set(state["ranks"]) == {pt["key"] for pt in state["meta"]["plan"]["points"]}
    for pt in state["meta"]["plan"]["points"]:
        r = state["ranks"][pt["key"]]
        assert r["run"] == f"{pt['key']}-lr{state['tuning'][pt['key']]['chosen']:g}-s0"
        assert r["heads"] == get_recipe("tiny").layers * pt["num_attention_heads"] and r["windows"] >= 1
        assert 1 <= r["logit_rank"] <= r["logit_rank_max"] <= min(pt["head_dim"], n)
        assert 0 <= r["at_ceiling"] <= 1
    assert (out / "ranks.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert report.startswith("# Scaling") and "Incomplete" not in report and record["plan_sha256"] in report
    assert set(record["summary"]) == {"standard", "threshold"} and "fit_flops" in record["summary"]["threshold"]
    # the same command reuses every run, also with the preset's seeds and grid written out; the
    # committed-report path renders the same report
    before = {k: r["train_seconds"] for k, r in state["runs"].items()}
    assert main([*argv, "--no-progress", "--seeds", "0", "1", "--learning-rates", "2e-3", "4e-3"]) == 0
    assert "grew" not in (out / "report.md").read_text()
    again = json.loads((out / "results.json").read_text())
    assert {k: r["train_seconds"] for r in again["runs"].values() for k, r in r["runs"].items()} == before
    assert regenerate(scaling.ScalingStudy(), out)[1] == (out / "report.md").read_text()


def test_scaling_options_are_refused_by_name_before_the_folder_is_touched(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["scaling", "--preset", "tiny", "--output-dir", str(out), "--no-progress"]
    # a masked recipe as Llama is refused, not trained as fixedhead
    assert main([*argv, "--architecture", "llama"]) == 2
    assert "--architecture llama trains causal LMs only, and recipe 'tiny'" in capsys.readouterr().err
    assert main([*argv, "--seeds", "1", "1"]) == 2
    assert "--seeds must be distinct, got 1 1" in capsys.readouterr().err
    assert main([*argv, "--learning-rates", "1e-3"]) == 2
    assert "rate" in capsys.readouterr().err
    # splitting a study by family is gone: workers sharing the folder split it point by point
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--families", "threshold"])
    assert exit.value.code == 2
    assert "--families is gone: workers that share one --output-dir split the study" in capsys.readouterr().err
    assert not out.exists()


def test_a_llama_family_counts_its_own_parameters_and_is_causal_only(tmp_path):
    """Llama-style points count N from transformers' LlamaForCausalLM (q, k, v, o, SwiGLU's three
    matrices and two RMSNorms per layer, a final norm; tied embeddings), and the masked recipe is refused."""
    from fixedhead.model.architectures import build_config

    d, h, dp, f, layers = 32, 4, 16, 128, 2
    config = build_config(
        dict(
            architecture="llama",
            hidden_size=d,
            num_attention_heads=h,
            head_dim=dp,
            intermediate_size=f,
            num_hidden_layers=layers,
            max_position_embeddings=32,
            vocab_size=100,
        )
    )
    i = h * dp
    assert non_embedding_parameters(config) == layers * (4 * d * i + 3 * d * f + 2 * d) + d
    with pytest.raises(ValueError, match="llama trains causal LMs only, and recipe .tiny. trains masked"):
        run_study(
            scaling.ScalingStudy(),
            scaling.ScalingOptions(preset="tiny", architecture="llama"),
            tmp_path / "s",
            progress=False,
        )
    assert not (tmp_path / "s").exists()


def test_the_gpu_preset_spans_the_issue_sizes_at_n_128():
    """The GPU preset's plan (built on the CPU, nothing trained): d up to 512 at n = 128, standard
    d_p = 16 against the causal threshold ⌈127/2⌉ = 64, ≥ 8x in non-embedding parameters per family."""
    p = scaling.spec(scaling.ScalingOptions(preset="gpu"))
    recipe = get_recipe(p.recipe)
    assert recipe.data.max_seq_length == 128 and recipe.train.bf16 and recipe.train.objective == "clm"
    points = scaling.plan_points(p, "clm", 128, recipe.data.vocab_size, recipe.train.batch_size, recipe.layers)
    assert {pt["head_dim"] for pt in points if pt["family"] == "standard"} == {16}
    assert {pt["head_dim"] for pt in points if pt["family"] == "threshold"} == {64}
    assert max(pt["hidden_size"] for pt in points) == 512
    for family in p.head_size_families:
        n_params = [pt["non_embedding_parameters"] for pt in points if pt["family"] == family]
        assert max(n_params) / min(n_params) >= 8
