"""Choosing a learning rate per arm: the grid, its extension past an edge, divergence."""

import math

import pytest

from fixedhead.studies.kit.learning_rate import (
    DIVERGED,
    best_rate,
    choose_rate,
    chosen_rate,
    later_seed_needs,
    parse_rates,
    point_rate,
    shared_rate_cost,
    shared_rate_text,
)

GRID = [5e-4, 1e-3, 2e-3, 4e-3]


def test_rates_are_parsed_distinct_and_ascending():
    assert parse_rates("2e-3, 5e-4,1e-3,1e-3") == [5e-4, 1e-3, 2e-3]
    assert parse_rates("1e-3,1.0000001e-3,2e-3") == [1e-3, 2e-3]  # rates that print alike (run names) are one
    for bad, message in [("1e-3", "at least 2 rates"), ("1e-3,fast", "'fast' is not a number"), ("0,1e-3", "positive")]:
        with pytest.raises(ValueError, match=message):
            parse_rates(bad)


def bowl(optimum):
    """A validation loss with its minimum at ``optimum`` (quadratic in log2 of the rate); records calls."""
    calls = []

    def train(lr):
        calls.append(lr)
        return 3.0 + (math.log2(lr) - math.log2(optimum)) ** 2

    return train, calls


def test_an_interior_optimum_needs_no_extension():
    train, calls = bowl(1e-3)
    best, losses, bracketed = choose_rate(train, GRID)
    assert (best, bracketed) == (1e-3, True) and calls == [5e-4, 1e-3, 2e-3, 4e-3]


@pytest.mark.parametrize(
    ("optimum", "added"), [(1.6e-2, [8e-3, 1.6e-2, 3.2e-2]), (1.25e-4, [2.5e-4, 1.25e-4, 6.25e-5])]
)
def test_an_optimum_at_an_edge_extends_the_grid_until_bracketed(optimum, added):
    train, calls = bowl(optimum)
    best, losses, bracketed = choose_rate(train, GRID)
    assert (best, bracketed) == (optimum, True)
    assert calls[4:] == added  # one factor-2 step at a time, past the edge the best sits on
    assert sorted(losses) == sorted(calls)


def test_extensions_are_capped_and_say_so():
    train, calls = bowl(1.0)
    best, losses, bracketed = choose_rate(train, GRID, max_extensions=2)
    assert (best, bracketed) == (1.6e-2, False) and len(calls) == 6
    with pytest.raises(ValueError, match="max_extensions must be an int >= 0, got -1"):
        choose_rate(train, GRID, max_extensions=-1)  # would never stop
    assert len(calls) == 6  # refused before training anything


def test_diverged_runs_count_as_worst():
    def train(lr):
        return DIVERGED if lr >= 4e-3 else {5e-4: 4.0, 1e-3: 3.5, 2e-3: 3.2}.get(lr, 5.0)

    best, losses, bracketed = choose_rate(train, [1e-3, 2e-3, 4e-3])
    assert (best, bracketed) == (2e-3, True) and losses[4e-3] == DIVERGED
    with pytest.raises(ValueError, match="every learning rate diverged"):
        best_rate({1e-3: DIVERGED, 2e-3: DIVERGED})


def test_the_rate_protocol_no_grid_first_seed_chooses_later_seed_reuses():
    train, calls = bowl(2e-3)
    runs = []

    def run(lr):
        runs.append(lr)
        return {"validation_loss": train(lr)}

    assert point_rate(run, None, seed=0, first_seed=0, default=1e-3) == {"learning_rate": 1e-3}
    assert runs == [1e-3] and later_seed_needs(None, 1, 0, "m-s0") == ()
    first = point_rate(run, [5e-4, 1e-3, 2e-3, 4e-3], seed=0, first_seed=0, default=1e-3)
    assert first["learning_rate"] == first["tuning"]["chosen"] == 2e-3 and first["tuning"]["bracketed"]
    assert first["tuning"]["validation_loss"]["0.0005"] == 7.0  # two factor-2 steps below 2e-3: 3 + 2²
    runs.clear()
    later = point_rate(run, [5e-4, 1e-3], seed=1, first_seed=0, default=1e-3, first=first)
    assert later == {"learning_rate": 2e-3} and runs == [2e-3]  # one run, at the first seed's choice
    assert (
        later_seed_needs([5e-4, 1e-3], 1, 0, "m-s0") == ("m-s0",) and later_seed_needs([5e-4, 1e-3], 0, 0, "m-s0") == ()
    )


def test_a_later_seed_reads_every_recorded_shape_of_the_chosen_rate():
    assert chosen_rate({"tuning": {"chosen": 2e-3}, "learning_rate": 2e-3}) == 2e-3
    assert chosen_rate({"learning_rate": 1e-3}) == 1e-3  # seq-len's and qk-v's models
    assert chosen_rate({"chosen": 4e-3, "tuning": None}) == 4e-3  # scaling and finetune-sweep results before
    with pytest.raises(ValueError, match="records no chosen rate.*'tuning.chosen'.*it has runs, seed"):
        chosen_rate({"seed": 1, "runs": {}})


def test_a_score_to_raise_is_chosen_by_its_highest_value_and_recorded_as_a_score():
    scores = {1e-4: 0.6, 3e-4: 0.8, 1e-3: 0.7}
    record = point_rate(
        lambda lr: {"accuracy": scores[lr]},
        [1e-4, 3e-4, 1e-3],
        seed=0,
        first_seed=0,
        default=None,
        score=lambda r: r["accuracy"],
        factor=3.0,
        maximise=True,
    )
    assert record["learning_rate"] == 3e-4
    assert record["tuning"]["validation_score"] == {"0.0001": 0.6, "0.0003": 0.8, "0.001": 0.7}


def test_shared_rate_cost_is_each_models_loss_above_its_own_best_at_rates_all_trained():
    tuning = {
        "a": {"chosen": 2e-3, "bracketed": True, "validation_loss": {"0.001": 5.0, "0.002": 4.8, "0.004": None}},
        "b": {
            "chosen": 1e-3,
            "bracketed": True,
            "validation_loss": {"0.0005": 5.5, "0.001": 4.9, "0.002": 5.2, "0.004": 5.3},
        },
    }
    cost = shared_rate_cost(tuning)
    assert list(cost) == [1e-3, 2e-3, 4e-3]  # 5e-4 only b trained
    assert cost[1e-3] == pytest.approx({"a": 0.2, "b": 0.0})
    assert cost[2e-3] == pytest.approx({"a": 0.0, "b": 0.3})
    assert cost[4e-3]["a"] == math.inf  # diverged there
    text = shared_rate_text(tuning)
    # 1e-3 costs the worst-off model 0.2, 2e-3 costs 0.3, 4e-3 a divergence
    assert "best single rate, 0.001" in text and "up to 0.200 nats" in text and "`a`" in text
    assert "mean over models 0.100" in text and "factor 2." in text
    assert shared_rate_text({"a": tuning["a"]}) == ""
    same = {"a": tuning["a"], "c": {**tuning["b"], "chosen": 2e-3}}  # no rate costs anyone anything
    assert shared_rate_text(same).startswith("The chosen rate is the same for every model, 0.002")
