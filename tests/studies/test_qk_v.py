"""The logit-rank or value-width study (fixedhead qk-v): its plan, its effects against a NumPy/SciPy
reference on synthetic losses, its sizing from the committed pilot, and the quick study end to end with
resume. Which size carries the lead is a learned outcome: it lives in docs/results, not here."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from _tiny_run import require_data
from fixedhead.data import DEFAULT_CORPUS
from fixedhead.model.architectures import build_config
from fixedhead.studies import STUDIES, study_class
from fixedhead.studies.compare import seq_len
from fixedhead.studies.compare.qk_v import (
    PILOT_SD,
    QUICK,
    QkVOptions,
    QkVStudy,
    arm_preset,
    effects,
    report_markdown,
    summarise,
)
from fixedhead.studies.kit.stats import seeds_for
from fixedhead.studies.kit.study import plan_file, run_study

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_is_four_arms_per_seed_and_later_seeds_need_the_first():
    plan = QkVStudy().plan(QkVOptions())
    arms = ["qk8-v8", "qk8-v32", "qk32-v8", "qk32-v32"]
    assert [p.key for p in plan] == [f"{a}-s{s}" for s in range(8) for a in arms]  # seed-major
    assert all(p.needs == () for p in plan[:4])
    assert all(p.needs == (f"{p.key.rsplit('-s', 1)[0]}-s0",) for p in plan[4:])
    pilot = QkVStudy().plan(replace(QUICK, learning_rates=[]))  # one shared rate: nothing to reuse
    assert len(pilot) == 8 and all(p.needs == () for p in pilot)


def test_each_arm_has_its_sizes_and_the_diagonal_is_seq_lens_pair():
    o = QkVOptions()
    models = arm_preset(o).models
    for name, fields in models.items():
        config = build_config({**fields, "vocab_size": 100})
        qk, v = (int(part[len(tag) :]) for part, tag in zip(name.split("-"), ("qk", "v"), strict=True))
        assert (config.layer_qk_head_dims, config.layer_v_head_dims) == ([qk, qk], [v, v])
        assert (config.hidden_size, config.num_attention_heads, config.max_position_embeddings) == (64, 8, 256)
    long = seq_len.SeqLenOptions(lengths=[256], architectures=["fixedhead"], steps=2800)  # seq-len-long's
    pair = seq_len.compare_preset(long, 256, "fixedhead")
    assert models["qk8-v8"] == pair.models["dp8"] and models["qk32-v32"] == pair.models["dp32"]
    p = arm_preset(o)
    assert (p.train.batch_size * 256, p.train.max_steps, p.data.max_seq_length) == (2048, 2800, 256)
    assert (p.data, p.train) == (pair.data, pair.train)  # seq-len-long's data and recipe


def test_the_effects_are_the_paired_contrasts_with_t_intervals_and_holm():
    rng = np.random.default_rng(0)
    seeds, s, big = list(range(5)), 8, 32
    o = replace(QkVOptions(), seeds=seeds)
    loss = {(qk, v): 5.2 + rng.normal(0, 0.02, len(seeds)) for qk in (s, big) for v in (s, big)}
    loss[(big, s)] -= 0.01
    loss[(s, big)] -= 0.05
    loss[(big, big)] -= 0.06
    got = effects({(qk, v, i): float(loss[(qk, v)][i]) for (qk, v) in loss for i in seeds}, o)
    per_seed = {
        "qk": (loss[(big, s)] - loss[(s, s)] + loss[(big, big)] - loss[(s, big)]) / 2,
        "v": (loss[(s, big)] - loss[(s, s)] + loss[(big, big)] - loss[(big, s)]) / 2,
        "interaction": loss[(big, big)] - loss[(big, s)] - loss[(s, big)] + loss[(s, s)],
    }
    ps = {k: stats.ttest_1samp(d, 0.0).pvalue for k, d in per_seed.items()}
    order = sorted(ps, key=ps.get)  # Holm by hand: the k-th smallest × (3 − k), running maximum, capped at 1
    holm, running = {}, 0.0
    for k, name in enumerate(order):
        running = max(running, min(1.0, (3 - k) * ps[name]))
        holm[name] = running
    assert got["seeds"] == seeds
    for row in got["rows"]:
        d = per_seed[row["effect"]]
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        assert row["estimate"] == pytest.approx(np.mean(d))
        assert (row["low"], row["high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
        assert row["sd"] == pytest.approx(np.std(d, ddof=1))
        assert row["p_holm"] == pytest.approx(holm[row["effect"]])
        assert got["per_seed"][row["effect"]] == pytest.approx(list(d))
    one = effects({(qk, v, 0): 5.0 for qk in (s, big) for v in (s, big)}, replace(o, seeds=[0]))
    assert all(r["word"] == "cannot tell (one seed)" and r["low"] is None for r in one["rows"])


def test_a_report_before_any_seed_finished_every_arm_reads_no_nan():
    """Two arms of seed 0 done: no effect has a seed yet, so the report says so instead of '+nan nats'."""
    o = QkVOptions()
    results = [
        {"qk_head_dim": 8, "v_head_dim": v, "seed": 0, "learning_rate": 4e-3, "heldout_loss": loss}
        for v, loss in ((8, 5.08), (32, 5.06))
    ]
    summary = summarise(results, o)
    assert summary["seeds"] == []
    assert all(r["word"] == "no seed has finished every arm" for r in summary["rows"])
    text = report_markdown({"summary": summary, "plan_sha256": "x", "meta": {"command": "c"}}, o)
    assert "nan" not in text
    assert "5.0800" in text and "5.0600" in text
    assert "**Partial: 0 of the planned 8 seeds have finished every arm;" in text


def test_a_partial_report_names_the_seeds_its_intervals_rest_on():
    """Seeds 0 and 1 through every arm, seed 2 through one: the effects rest on two seeds, and the report says
    that the plan asked for eight; a complete study carries no such line."""
    o = QkVOptions()
    results = [
        {"qk_head_dim": qk, "v_head_dim": v, "seed": s, "learning_rate": 4e-3, "heldout_loss": 5.0 + 0.01 * s}
        for s in (0, 1)
        for qk in (8, 32)
        for v in (8, 32)
    ] + [{"qk_head_dim": 8, "v_head_dim": 8, "seed": 2, "learning_rate": 4e-3, "heldout_loss": 5.1}]
    summary = summarise(results, o)
    assert summary["seeds"] == [0, 1]
    record = {"summary": summary, "plan_sha256": "x", "meta": {"command": "c"}}
    text = report_markdown(record, o)
    assert "**Partial: 2 of the planned 8 seeds have finished every arm (seeds [0, 1]);" in text
    two = replace(o, seeds=[0, 1])
    assert "Partial" not in report_markdown({**record, "summary": summarise(results[:8], two)}, two)


def test_the_seeds_are_sized_from_the_committed_pilot():
    """seq-len-long's fixedhead paired gaps, d_p 32 − 8 at n = 256, 128, 64, seeds 0 and 1: their sd pooled over n
    is the pilot sd the plan states, and 8 seeds see 0.02 nats at it (α = 0.01 / 3, 80% power)."""
    record = json.loads((ROOT / "docs/results/seq-len-long/results.json").read_text())
    loss = {
        (m["n"], m["head_dim"], m["seed"]): m["heldout_loss"]
        for r in record["runs"].values()
        for m in r["models"]
        if m["architecture"] == "fixedhead"
    }
    sds = [np.std([loss[(n, 32, s)] - loss[(n, 8, s)] for s in (0, 1)], ddof=1) for n in (256, 128, 64)]
    assert math.sqrt(np.mean(np.square(sds))) == pytest.approx(PILOT_SD, abs=5e-5)
    plan = plan_file(QkVStudy(), QkVOptions())["plan"]
    assert plan["sizing"]["seeds_for"]["gap"] == seeds_for(PILOT_SD, 0.02, 0.01 / 3) == len(QkVOptions().seeds) == 8
    assert plan["target_nats"] == 0.02 and plan["pairing"].startswith("by seed")


def test_the_registered_plan_is_the_one_the_command_writes():
    """docs/results/qk-v/plan.json, committed before any point ran, is what `fixedhead qk-v` plans by default."""
    committed = json.loads((ROOT / "docs/results/qk-v/plan.json").read_text())
    planned = plan_file(QkVStudy(), QkVOptions())
    assert (committed["plan"], committed["sha256"]) == (planned["plan"], planned["sha256"])
    assert committed["history"] == [] and len(committed["plan"]["points"]) == 32


@pytest.mark.parametrize(
    "change, bad",
    [
        ({"head_dims": [8]}, "head_dims"),
        ({"head_dims": [32, 8]}, "head_dims"),
        ({"tokens_per_step": 1000}, "multiple"),
        ({"learning_rates": [1e-3]}, "learning_rates"),
        ({"target": 0.0}, "target"),
        ({"pilot_sd": math.nan}, "pilot_sd"),
        ({"seeds": []}, "^seeds must hold at least one value, got none$"),  # not seq-len's words (lengths=...)
        ({"seeds": [1, 1]}, r"^seeds must be distinct, got \[1, 1\]$"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_by_name(change, bad):
    with pytest.raises(ValueError, match=bad):
        replace(QkVOptions(), **change)


def test_the_quick_study_end_to_end_reuses_the_first_seeds_rates_and_resumes(tmp_path, monkeypatch):
    import fixedhead.studies.compare as compare

    require_data(DEFAULT_CORPUS)  # the quick study trains on the default corpus
    assert study_class("qk-v") is QkVStudy and STUDIES["qk-v"].endswith(":QkVStudy")
    calls = []
    train_model = compare.train_model

    def counted(s, name, *args, **kw):
        calls.append((name, s.grid, s.rates[name]))
        return train_model(s, name, *args, **kw)

    monkeypatch.setattr(compare, "train_model", counted)
    out = tmp_path / "out"
    first = run_study(QkVStudy(), replace(QUICK, seeds=[0]), out, progress=False, command="test")
    assert len(calls) == 4 and all(grid == QUICK.learning_rates for _, grid, _ in calls)
    chosen = {k[: -len("-s0")]: r["learning_rate"] for k, r in first["runs"].items()}
    assert all(r["tuning"]["chosen"] == chosen[k[:-3]] for k, r in first["runs"].items())

    calls.clear()  # seed 1 grows the study: each arm trains once, at the rate its seed-0 point chose
    record = run_study(QkVStudy(), QUICK, out, grow=True, progress=False, command="test")
    assert sorted(calls) == sorted((name, None, rate) for name, rate in chosen.items())
    assert not record["missing"] and len(record["runs"]) == 8

    calls.clear()  # everything finished: a rerun trains nothing and summarises the same
    again = run_study(QkVStudy(), QUICK, out, grow=True, progress=False, command="test")
    assert calls == [] and again["summary"] == record["summary"]

    runs = record["runs"]
    loss = {(r["qk_head_dim"], r["v_head_dim"], r["seed"]): r["heldout_loss"] for r in runs.values()}
    qk = [((loss[(8, 4, s)] - loss[(4, 4, s)]) + (loss[(8, 8, s)] - loss[(4, 8, s)])) / 2 for s in (0, 1)]
    rows = {r["effect"]: r for r in record["summary"]["rows"]}
    assert rows["qk"]["estimate"] == pytest.approx(np.mean(qk))
    report = (out / "report.md").read_text()
    assert record["plan_sha256"] in report and "| qk_head_dim (logit rank) |" in report
    assert (out / "qk_v.csv").read_text().count("\n") == 1 + 8
