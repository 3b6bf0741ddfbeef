"""The coordinate check: μP's output projection keeps the attention's update flat in width."""

import json

import pytest

from fixedhead.cli import main
from fixedhead.studies.coordcheck import QUICK, CoordCheckSettings, CoordCheckStudy, coord_check, result_of
from fixedhead.studies.kit.study import run_study


@pytest.fixture(scope="module")
def tiny_result():
    return coord_check(QUICK, progress=False)


@pytest.mark.parametrize("axis", ["head_dim", "num_heads"])
def test_mup_output_projection_is_flat_where_the_standard_one_grows(tiny_result, axis):
    # Adam moves every weight by about lr, so a W_o with fan-in h·d_p moves its output in
    # proportion to h·d_p (slope 1, Tensor Programs V); μP's W_o (lr and init × base/width)
    # cancels it (slope 0). Tolerance ±0.15 on a 16× range of widths (a 1.5× spread).
    assert tiny_result.slope(axis, "standard", "attention_output") > 0.6
    assert abs(tiny_result.slope(axis, "mup", "attention_output")) < 0.15
    assert abs(tiny_result.slope(axis, "mup", "block_output")) < 0.15


def test_coordcheck_writes_its_outputs(tiny_result, tmp_path):
    record = run_study(CoordCheckStudy(), QUICK, tmp_path / "cc", progress=False)
    saved = json.loads((tmp_path / "cc" / "results.json").read_text())
    assert {r["parametrization"] for r in saved["summary"]} == {"standard", "mup"}
    # every run's curve: axes × variants × widths × seeds points, each quantity one value per step 0..5
    assert len(saved["runs"]) == 2 * 2 * 3 * 1
    leaves = [leaf for point in saved["runs"].values() for leaf in point["curves"].values()]
    assert len(leaves) == 2 * 2 * 3 * 6 and all(len(leaf["mean_abs_change"]) == 6 for leaf in leaves)
    # the stored (5-digit) curves give the in-memory slopes to that precision
    again = result_of(QUICK, saved["runs"].values())
    for row in record["summary"]:
        for q in ("attention_output", "block_output"):
            want = tiny_result.slope(row["axis"], row["parametrization"], q)
            assert again.slope(row["axis"], row["parametrization"], q) == pytest.approx(want, abs=1e-3)
    for axis in ("head_dim", "num_heads"):
        assert (tmp_path / "cc" / f"coordcheck_{axis}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("x")
    with pytest.raises(FileExistsError):
        run_study(CoordCheckStudy(), QUICK, tmp_path / "other", progress=False)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(head_dims=(8,)), "at least two widths"),
        (dict(parametrizations=("standard", "muP")), "unknown parametrization variant"),
        (dict(learning_rate=0.0), "learning_rate must be a positive"),
        (dict(axes=("depth",)), "unknown axis"),
    ],
)
def test_bad_settings_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        CoordCheckSettings(**fields)


def test_coordcheck_command(tmp_path, capsys):
    out = tmp_path / "cc"
    assert main(["coordcheck", "--quick", "--axes", "head_dim", "--output-dir", str(out), "--no-progress"]) == 0
    assert "| head_dim | mup |" in capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved["options"]["axes"] == ["head_dim"] and saved["options"]["steps"] == 5
    assert main(["coordcheck", "--quick", "--steps", "0", "--output-dir", str(tmp_path / "x")]) == 2
    assert "steps must be" in capsys.readouterr().err
