"""The projected farthest-point task and the `fixedhead farthest-point` experiment (issue 11).

Expected values come from NumPy brute force or from the mathematics of the task, never from the
code under test. No test asserts a learned number that depends on luck: the trained grid's
numbers live in docs/results/synthetic/, with their seeds.
"""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fixedhead.cli import main
from fixedhead.data.synthetic import (
    FarthestPointTask,
    farthest_point_indices,
    orthonormal_projection,
    sample_sphere,
)
from fixedhead.model.attention import MultiHeadAttention
from fixedhead.studies import farthest_point as S
from fixedhead.studies.farthest_point import set_attention as M
from fixedhead.studies.kit.study import run_study


def _np_sets(num_sets, n, d, seed):
    x = np.random.default_rng(seed).normal(size=(num_sets, n, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------------- the task
def test_projection_has_orthonormal_rows_and_is_seeded():
    u = orthonormal_projection(5, 12, seed=3).double().numpy()
    np.testing.assert_allclose(u @ u.T, np.eye(5), atol=1e-6)
    assert torch.equal(orthonormal_projection(5, 12, seed=3), orthonormal_projection(5, 12, seed=3))
    assert not torch.equal(orthonormal_projection(5, 12, seed=3), orthonormal_projection(5, 12, seed=4))
    full = orthonormal_projection(6, 6, seed=0).double().numpy()  # r = d: a rotation, UᵀU = I
    np.testing.assert_allclose(full.T @ full, np.eye(6), atol=1e-6)


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_target_matches_numpy_brute_force(rank):
    task = FarthestPointTask(dim=8, rank=rank, num_points=7, seed=1)
    x, t, idx = task.sample(50, torch.Generator().manual_seed(0))
    assert x.shape == t.shape == (50, 7, 8) and idx.shape == (50, 7)
    np.testing.assert_allclose(x.norm(dim=-1).numpy(), 1.0, atol=1e-6)  # on the unit sphere
    xs, u = x.double().numpy(), task.projection.double().numpy()
    for b in range(50):
        for i in range(7):
            scores = [float((u @ xs[b, i]) @ (u @ xs[b, j])) for j in range(7)]
            j_star = min(range(7), key=scores.__getitem__)
            assert idx[b, i].item() == j_star
            np.testing.assert_array_equal(t[b, i].numpy(), x[b, j_star].numpy())


def test_farthest_point_with_full_rank_is_the_plain_farthest_point():
    # r = d: U is a rotation, so the target is argmin_j <x_i, x_j> (Amsel et al.'s task)
    x = torch.from_numpy(_np_sets(20, 9, 5, seed=2))
    idx = farthest_point_indices(x, orthonormal_projection(5, 5, seed=7).double())
    np.testing.assert_array_equal(idx.numpy(), np.einsum("bid,bjd->bij", x.numpy(), x.numpy()).argmin(-1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=4, rank=5), "rank must be at most dim"),
        (dict(dim=4, rank=0), "rank must be a positive int"),
        (dict(dim=4, rank=2, num_points=1), "num_points must be at least 2"),
        (dict(dim=4.0, rank=2), "dim must be a positive int"),
        (dict(dim=4, rank=True), "rank must be a positive int"),
    ],
)
def test_task_refuses_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FarthestPointTask(**kwargs)


def test_sample_and_indices_refuse_bad_input():
    task = FarthestPointTask(4, 2, 5)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        task.sample(0)
    with pytest.raises(ValueError, match=r"projection must be \[r, 4\]"):
        farthest_point_indices(torch.zeros(2, 5, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"points must be \[batch, N, d\]"):
        farthest_point_indices(torch.zeros(5, 4), torch.zeros(2, 4))


# -------------------------------------------------------------------------------- metrics
def test_prediction_metrics_match_numpy():
    rng = np.random.default_rng(0)
    x = _np_sets(30, 6, 4, seed=1)
    idx = rng.integers(0, 6, size=(30, 6))
    t = np.take_along_axis(x, idx[..., None], axis=1)
    o = t + rng.normal(scale=0.3, size=t.shape)  # near the targets, some hits and some misses
    err = ((o - t) ** 2).sum(-1)
    gap = np.linalg.norm(t[:, :, None, :] - x[:, None, :, :], axis=-1)  # [b, i, k]
    np.put_along_axis(gap, idx[..., None], np.inf, axis=2)
    hit = np.sqrt(err) < 0.5 * gap.min(-1)
    nearest = np.linalg.norm(o[:, :, None, :] - x[:, None, :, :], axis=-1).argmin(-1) == idx
    got = M.prediction_metrics(*(torch.from_numpy(a) for a in (x, t)), torch.from_numpy(idx), torch.from_numpy(o))
    assert got["mse"] == pytest.approx(err.mean(), rel=1e-9)
    assert got["hit_rate"] == pytest.approx(hit.mean())
    assert got["nearest_rate"] == pytest.approx(nearest.mean())
    assert 0.05 < hit.mean() < 0.95  # the check above exercises both outcomes


def test_nearest_point_rate_is_fooled_without_attention():
    # x_i -> -UᵀU x_i never looks at the other points, yet its nearest point on the sphere is
    # argmax_j <-UᵀU x_i, x_j> = argmin_j <U x_i, U x_j> = j*(i) on every point: why verdicts use
    # the hit rate (with a margin) instead.
    for rank in (3, 8):
        task = FarthestPointTask(8, rank, 10, seed=0)
        u = task.projection
        x, t, idx = task.sample(200, torch.Generator().manual_seed(1), u)
        m = M.prediction_metrics(x, t, idx, -(x @ u.T @ u))
        assert m["nearest_rate"] == 1.0
        assert m["hit_rate"] < 0.05  # ‖o − x_j*‖ ≈ 1 beats half the gap only around isolated points


# ---------------------------------------------------------------- hand-built layers (paper §3)
def _hand_built_attention(d, factors_q, factors_k, c):
    """MultiHeadAttention whose every head has W_q W_kᵀ = −c·AᵀC (A, C: [k, d]) and whose values
    split x's d coordinates between the heads (head i carries coordinates k·i .. k·i + k − 1)."""
    k = factors_q.shape[0]
    h = math.ceil(d / k)
    attn = MultiHeadAttention(d, h, head_dim=k, bias=False).double()
    with torch.no_grad():
        w = torch.zeros(3, h, k, d, dtype=torch.float64)  # qkv weight rows: [q|k|v] × head × d_p
        for i in range(h):
            w[0, i] = -c * math.sqrt(k) * factors_q  # × √d_p cancels the layer's 1/√d_p
            w[1, i] = factors_k
            for j in range(k):
                if i * k + j < d:
                    w[2, i, j, i * k + j] = 1.0
        attn.qkv.weight.copy_(w.reshape(3 * h * k, d))
        out = torch.zeros(d, h * k, dtype=torch.float64)  # head i's coordinate j back to x's i·k + j
        for col in range(min(d, h * k)):
            out[col, col] = 1.0
        attn.out_proj.weight.copy_(out)
    return attn


def _layer_error(attn, task, num_sets=400, seed=5):
    x, t, idx = task.sample(num_sets, torch.Generator().manual_seed(seed))
    x, t = x.double(), t.double()
    with torch.no_grad():
        o, p = attn(x, output_attentions=True)
    argmax_ok = (p.argmax(-1) == idx[:, None, :]).double().mean().item()
    return ((o - t) ** 2).sum(-1).mean().item(), argmax_ok


def _best_rank_k_form(u, k, x, idx, steps=150):
    """The rank-k form −AᵀC closest to picking j*: from the truncated SVD of UᵀU (Eckart–Young, as
    fixedhead.theory.best_logits), then Adam on the cross-entropy of softmax over j against j*."""
    w, v = np.linalg.eigh(u.T @ u)
    a0 = torch.from_numpy((v[:, -k:] * np.sqrt(w[-k:])).T.copy())
    a, c = a0.clone().requires_grad_(True), a0.clone().requires_grad_(True)
    log_t = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([a, c, log_t], lr=0.05)
    for _ in range(steps):
        logits = -log_t.exp() * torch.einsum("bid,kd,ke,bje->bij", x, a, c, x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, x.shape[1]), idx.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return a.detach(), c.detach()


def test_heads_of_size_r_solve_the_task_without_training():
    d, r = 8, 4
    task = FarthestPointTask(d, r, num_points=8, seed=0)
    u = task.projection.double()
    attn = _hand_built_attention(d, u, u, c=2000.0)  # 2 heads of size r = 4, values 4 + 4 coordinates
    mse, argmax_ok = _layer_error(attn, task)
    assert argmax_ok > 0.999  # every head's argmax is j*
    assert mse < 1e-2  # the output is x_j* (predicting 0 scores 1)


def test_best_head_of_size_r_minus_1_does_not():
    d, r = 8, 4
    task = FarthestPointTask(d, r, num_points=8, seed=0)
    u = task.projection.double()
    x, _, idx = task.sample(500, torch.Generator().manual_seed(9))
    # NumPy, not the code under test: UᵀU is a projection with r equal eigenvalues, so the best
    # rank-(r−1) form in Frobenius norm drops one direction; its argmin is wrong on many points
    xs = x.double().numpy()
    w, v = np.linalg.eigh(u.numpy().T @ u.numpy())
    assert np.allclose(w[-r:], 1.0) and np.allclose(w[:-r], 0.0)
    trunc = v[:, -(r - 1) :] @ v[:, -(r - 1) :].T
    right = np.einsum("bid,de,bje->bij", xs, trunc, xs).argmin(-1) == idx.numpy()
    assert right.mean() < 0.85
    # fitted: the same construction with 3 heads of size r − 1 (values 3 + 3 + 2 coordinates)
    a, c = _best_rank_k_form(u.numpy(), r - 1, x.double(), idx)
    attn = _hand_built_attention(d, a / a.norm() * 2, c / c.norm() * 2, c=2000.0)
    mse, argmax_ok = _layer_error(attn, task)
    assert argmax_ok < 0.85
    assert mse > 0.2


# ------------------------------------------------------------------------------------- model
def test_model_scales_the_logits_and_keeps_shapes():
    torch.manual_seed(0)
    m = M.SetAttentionModel(8, 4, 3, logit_scale=5.0, input_scale=2.0)
    x = sample_sphere((2, 6), 8)
    out, p = m(x, output_attentions=True)
    assert out.shape == (2, 6, 8) and p.shape == (2, 4, 6, 6)
    q, k, _ = m.attention.qkv(2.0 * x).view(2, 6, 3, 4, 3).permute(2, 0, 3, 1, 4)
    expected = torch.softmax(q @ k.transpose(-1, -2) * 5.0 / math.sqrt(3), dim=-1)
    torch.testing.assert_close(p, expected)
    torch.testing.assert_close(m(x), out)  # the SDPA path (no probabilities) gives the same output


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden_size=8, num_attention_heads=2, head_dim=3), r"2 × 3 = 6 < hidden_size = 8"),
        (dict(hidden_size=8, num_attention_heads=2, head_dim=4, logit_scale=0.0), "logit_scale must be a positive"),
        (dict(hidden_size=8, num_attention_heads=2, head_dim=4, input_scale=float("nan")), "input_scale must be"),
        (dict(hidden_size=8, num_attention_heads=0, head_dim=4), "num_attention_heads must be a positive int"),
    ],
)
def test_model_refuses_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.SetAttentionModel(**kwargs)


def test_recipe_refuses_bad_values():
    with pytest.raises(ValueError, match="learning_rate must be a positive finite number"):
        M.FarthestPointRecipe(learning_rate=0.0)
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        M.FarthestPointRecipe(warmup_ratio=1.0)


def test_the_default_grid():
    p = S.FarthestPointOptions()
    keys = [c.key for c in p.cells()]
    assert len(keys) == 16 + 3 and len(set(keys)) == len(keys)  # r16-dp4-h8 is in the grid and the row once
    assert all(c.num_heads * c.head_dim >= p.dim for c in p.cells())  # values can carry a point
    assert p.grid_heads * 4 == p.dim  # d_p = 4 is the standard d/h
    assert len(p.seeds) >= 3
    with pytest.raises(ValueError, match="seeds must be distinct"):
        S.FarthestPointOptions(seeds=(1, 1))
    with pytest.raises(ValueError, match="ranks must hold at least one value"):
        S.FarthestPointOptions(ranks=())
    with pytest.raises(ValueError, match="more_heads must be a positive int, got 0"):
        S.FarthestPointOptions(more_heads=(0, 8))
    with pytest.raises(ValueError, match="curve_points = 20 is more than steps = 5"):
        S.FarthestPointOptions(recipe=M.FarthestPointRecipe(steps=5))


# ------------------------------------------------------------------------------ end to end
def test_quick_grid_end_to_end_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "fp"
    record = run_study(S.FarthestPointStudy(), S.QUICK, out, progress=False, command="test")
    runs = {k: r["run"] for k, r in record["runs"].items()}
    assert len(runs) == len(S.QUICK.cells()) * len(S.QUICK.seeds) and not record["missing"]
    for r in runs.values():
        assert all(math.isfinite(r[k]) for k in ("mse", "hit_rate", "nearest_rate"))
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == S.QUICK.recipe.steps
    for name in ("results.json", "plan.json", "results.csv", "heatmap.png", "more_heads.png", "learning_curves.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "Reference without attention" in report and record["plan_sha256"] in report
    assert {v["verdict"] for v in record["summary"]["grid"]} <= {"succeeds", "fails", "in between"}

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(S, "train_cell", no_training)
    again = run_study(
        S.FarthestPointStudy(), S.QUICK, out, progress=False, command="test"
    )  # resumes: everything reused
    assert again["runs"] == record["runs"]
    shorter = replace(S.QUICK, recipe=replace(S.QUICK.recipe, steps=4))
    with pytest.raises(FileExistsError, match=r"other settings \(--steps: 40 → 4\)"):
        run_study(S.FarthestPointStudy(), shorter, out, progress=False)
    # another rank adds cells: only those train, with --grow
    monkeypatch.undo()
    wider = replace(S.QUICK, ranks=(2, 4, 8))
    with pytest.raises(FileExistsError, match="pass --grow"):
        run_study(S.FarthestPointStudy(), wider, out, progress=False)
    grown = run_study(S.FarthestPointStudy(), wider, out, grow=True, progress=False)
    assert set(grown["runs"]) - set(record["runs"]) == {f"r8-dp{dp}-h4-s0" for dp in (2, 4)}


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "foreign.txt").write_text("x")
    assert main(["farthest-point", "--quick", "--output-dir", str(tmp_path), "--no-progress"]) == 2
    assert "did not create (foreign.txt)" in capsys.readouterr().err
    assert main(["farthest-point", "--quick", "--output-dir", str(tmp_path / "a"), "--steps", "0"]) == 2
    assert "--steps must be a positive int, got 0" in capsys.readouterr().err
    assert main(["farthest-point", "--quick", "--output-dir", str(tmp_path / "b"), "--threads", "0"]) == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before writing
    # the quick grid is --quick, not a preset
    with pytest.raises(SystemExit) as exit:
        main(["farthest-point", "--preset", "quick", "--output-dir", str(tmp_path / "c")])
    assert exit.value.code == 2 and "--preset is gone: --quick" in capsys.readouterr().err


def test_each_cell_chooses_its_rate_on_the_curve_sets(tmp_path, monkeypatch):
    """With a grid, each cell trains every rate with the first seed, keeps the lowest final MSE on the
    curve sets (not the eval sets results are scored on), and the other seeds train at that rate."""
    out = tmp_path / "fp"
    options = replace(S.QUICK, seeds=(0, 1), learning_rates=(1e-3, 3e-2), max_extensions=0)
    record = run_study(S.FarthestPointStudy(), options, out, progress=False)
    state = S.state_of(options, record["runs"].values(), record["meta"])
    cells = options.cells()
    assert set(state["tuning"]) == {c.key for c in cells} and len(state["lr_grid"]) == 2 * len(cells)
    for c in cells:
        curve_mse = {lr: state["lr_grid"][f"{c.key}-lr{lr:g}"]["curve"][-1][1] for lr in (1e-3, 3e-2)}
        best = min(curve_mse, key=curve_mse.get)
        assert state["tuning"][c.key]["chosen"] == best
        assert state["tuning"][c.key]["validation_loss"] == pytest.approx({f"{lr:g}": v for lr, v in curve_mse.items()})
        assert state["runs"][f"{c.key}-s0"] == state["lr_grid"][f"{c.key}-lr{best:g}"]
        assert state["runs"][f"{c.key}-s1"]["learning_rate"] == best  # the other seed at the chosen rate
    assert len(state["runs"]) == 2 * len(cells)  # only chosen-rate runs are results
    report = (out / "report.md").read_text()
    assert "(learning_rates.png)" in report and (out / "learning_rates.png").stat().st_size > 0

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(S, "train_cell", no_training)
    again = run_study(S.FarthestPointStudy(), options, out, progress=False)
    assert again["runs"] == record["runs"]
    with pytest.raises(FileExistsError, match="other settings"):
        run_study(S.FarthestPointStudy(), replace(options, learning_rates=(1e-3, 1e-2)), out, progress=False)
