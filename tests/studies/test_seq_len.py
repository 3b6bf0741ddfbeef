"""The sequence-length study (fixedhead seq-len): its plan, its statistics against scipy, and one tiny
run end to end. Which head size wins is a learned outcome: it lives in docs/results, not here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
from scipy import stats

from _tiny_run import require_data
from fixedhead.data import DEFAULT_CORPUS
from fixedhead.model.architectures import build_config
from fixedhead.studies.compare.seq_len import (
    QUICK,
    SeqLenOptions,
    SeqLenStudy,
    compare_preset,
    gap_row,
    gap_word,
    models,
    summarise,
)
from fixedhead.studies.kit.study import run_study


def test_the_gap_is_scipys_paired_t_interval_and_one_seed_has_none():
    large, small = [5.41, 5.47, 5.44, 5.50], [5.44, 5.45, 5.49, 5.52]
    want = stats.ttest_rel(large, small)
    got = gap_row(large, small)
    assert got["gap"] == pytest.approx(sum(large) / 4 - sum(small) / 4)
    interval = want.confidence_interval(0.95)
    assert (got["low"], got["high"], got["p"]) == tuple(map(pytest.approx, (interval.low, interval.high, want.pvalue)))
    one = gap_row([5.0], [5.1])
    assert one["low"] is None and gap_word(one, 0.02) == "cannot tell (one seed)"


def test_rows_are_holm_corrected_and_sized():
    o = replace(QUICK, lengths=[32, 64], architectures=["fixedhead"])
    runs = [
        {"n": n, "architecture": "fixedhead", "head_dim": dp, "seed": s, "learning_rate": 1e-3, "heldout_loss": loss}
        | {"curve": {"needed": {"all": dp}, "attention_gain": 0.1}}
        for n, shift in ((32, 0.0), (64, 0.05))
        for s, noise in ((0, 0.0), (1, 0.01))
        for dp, loss in ((4, 5.0 + noise), (8, 5.0 + shift + 2 * noise))
    ]
    rows = summarise(runs, o)
    ps = [stats.ttest_rel([5.0 + shift, 5.02 + shift], [5.0, 5.01]).pvalue for shift in (0.0, 0.05)]
    low, high = sorted(ps)  # Holm over two: the smaller × 2, the larger at least that
    want = [min(1, 2 * low) if p == low else max(min(1, 2 * low), high) for p in ps]
    assert [r["p_holm"] for r in rows] == pytest.approx(want)
    assert all(r["seeds_for_target"] >= 2 for r in rows)
    assert [r["needed_dp4"] for r in rows] == [4, 4]


@pytest.mark.parametrize(
    "change, bad",
    [
        ({"tokens_per_step": 100}, "multiple"),
        ({"learning_rates": [1e-3]}, "learning_rates"),
        ({"architectures": ["gpt"]}, "architectures"),
        ({"head_dims": [8]}, "head_dims"),
        ({"target": 0.0}, "target"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_by_name(change, bad):
    with pytest.raises(ValueError, match=bad):
        replace(SeqLenOptions(), **change)


def test_every_n_trains_on_the_same_tokens_per_step_with_positions_for_n():
    o = SeqLenOptions()
    for n in o.lengths:
        for arch in o.architectures:
            p = compare_preset(o, n, arch)
            assert p.train.batch_size * n == 2048 and p.data.max_seq_length == n and p.train.objective == "clm"
            assert p.data.validation_fraction > 0  # the pilot and the tuned study train on the same documents
            for name, fields in p.models.items():
                config = build_config({**fields, "vocab_size": 100})
                assert config.max_position_embeddings == n
                head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
                assert (config.num_attention_heads, head_dim) == (8, int(name[2:]))


def test_the_plan_is_hashed_before_results_and_states_its_rule():
    from fixedhead.studies.kit.study import plan_file

    record = plan_file(SeqLenStudy(), QUICK)
    text = json.dumps(record["plan"], indent=1, sort_keys=True)
    assert record["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    plan = record["plan"]
    assert plan["study"] == "seq-len" and plan["target_nats"] == QUICK.target and plan["pairing"].startswith("by seed")
    # seed-major: every (n, architecture) at seed 0 (which chooses the rates) before any seed 1
    assert plan["points"] == [f"n{n}-{a}-s{s}" for s in (0, 1) for n in (32, 64) for a in ("fixedhead", "llama")]


def test_a_tiny_study_end_to_end(tmp_path):
    require_data(DEFAULT_CORPUS)  # the quick study trains on the default corpus
    # the rank intervention scores the held-out tokens training scored (the tiny recipe's 4,000)
    o = replace(QUICK, lengths=[32], architectures=["fixedhead"], steps=2, seeds=[0], max_eval_tokens=4_000, ranks=[2])
    record = run_study(SeqLenStudy(), o, tmp_path / "out", progress=False, command="test")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert record["plan_sha256"] == plan["sha256"] and not record["plan_history"]
    trained = models(record["runs"].values())
    assert [(r["head_dim"], r["seed"]) for r in trained] == [(4, 0), (8, 0)]
    for r in trained:
        c = r["curve"]
        assert c["full"] == pytest.approx(r["heldout_loss"], abs=1e-4)  # scored as training scored it
        assert c["attention_gain"] == pytest.approx(c["uniform"] - c["full"])
    (row,) = record["summary"]
    by = {r["head_dim"]: r["heldout_loss"] for r in trained}
    assert row["gap"] == pytest.approx(by[8] - by[4]) and row["word"] == "cannot tell (one seed)"
    report = (tmp_path / "out" / "report.md").read_text()
    assert plan["sha256"] in report and "a pilot: no verdict" in report
    assert (tmp_path / "out" / "seq_len.png").stat().st_size > 0


def test_the_command_line_reads_the_plan_from_the_dataclass():
    from fixedhead.cli import build_parser
    from fixedhead.options import given

    args = build_parser().parse_args(["seq-len", "--lengths", "64", "128", "--learning-rates", "--no-per-layer"])
    options = replace(SeqLenOptions(), **given(args, SeqLenOptions))
    assert options == replace(SeqLenOptions(), lengths=[64, 128], learning_rates=[], per_layer=False)
    assert given(build_parser().parse_args(["seq-len"]), SeqLenOptions) == {}  # the dataclass's defaults apply
    text = build_parser()._subparsers._group_actions[0].choices["seq-len"].format_help()
    assert "(default: 32 64 128 256)" in text and "(default: 0.02)" in text
