"""A preset is the options a run starts from: a list given empty is a value (the study's own meaning or a
refusal), never the preset's; a preset's own rates hold only for its models; errors about values a preset gave
name the preset; a refusal suggests only options the command has."""

import argparse
import dataclasses

import pytest

from fixedhead.cli import main
from fixedhead.options import add_nested_options, options_from
from fixedhead.studies.compare import CompareOptions, CompareStudy
from fixedhead.studies.kit.recipes import get_recipe
from fixedhead.studies.scaling import ScalingOptions
from fixedhead.studies.sweep import SweepOptions
from fixedhead.studies.widening import WideningOptions


def parsed(cls, argv):
    """The options of ``cls`` as the command line reads ``argv``."""
    parser = argparse.ArgumentParser()
    add_nested_options(parser, cls, title="options")
    return options_from(parser.parse_args(argv), cls())


def test_model_learning_rates_given_empty_clears_the_presets_rates():
    """`--model-learning-rates` with no value: no model has its own rate, every one trains at the recipe's."""
    recipe_rate = get_recipe("cpu-clm").train.learning_rate
    study = CompareStudy()
    kept = study.resolve(parsed(CompareOptions, []))  # the cpu preset's own rates
    assert kept.options.model_learning_rates == (2e-3, 2e-3, 2e-3) and kept.rates["fixed"] == 2e-3 != recipe_rate
    cleared = study.resolve(parsed(CompareOptions, ["--model-learning-rates"]))
    assert cleared.options.model_learning_rates == ()
    assert set(cleared.rates.values()) == {recipe_rate} and f"learning rate {recipe_rate:g}" in cleared.description


@pytest.mark.parametrize(
    "cls, argv",
    [
        (SweepOptions, ["--seeds"]),
        (ScalingOptions, ["--seeds"]),
        (ScalingOptions, ["--learning-rates"]),
        (ScalingOptions, ["--head-size-families"]),
        (WideningOptions, ["--seeds"]),
        (WideningOptions, ["--logging-steps"]),
    ],
)
def test_a_list_a_preset_sets_given_empty_is_refused_naming_it(cls, argv):
    """Where an empty list has no meaning (no seed, no grid, no family), giving it is refused by name instead of
    silently running the preset's list."""
    field = argv[0][2:].replace("-", "_")
    with pytest.raises(ValueError, match=rf"{field}"):
        parsed(cls, argv)


def test_a_presets_own_rates_are_kept_only_for_its_models():
    """cpu-mup's rates were chosen for its μP models: with --parametrization standard (or another architecture,
    size, recipe or objective) every model trains at the recipe's rate and the description says why; rates given
    are kept."""
    study, recipe_rate = CompareStudy(), get_recipe("cpu-clm").train.learning_rate
    mup = study.resolve(CompareOptions(preset="cpu-mup"))
    assert mup.rates == {"standard": 2e-3, "fixed": 2e-3, "standard-wide": 1e-3}
    standard = study.resolve(CompareOptions(preset="cpu-mup", parametrization="standard"))
    assert set(standard.rates.values()) == {recipe_rate} and standard.options.model_learning_rates == ()
    assert "not preset cpu-mup's own rates, chosen for its models: here parametrization='standard'" in (
        standard.description
    )
    rates = (1e-3, 1e-3, 1e-3)
    given = study.resolve(CompareOptions(preset="cpu-mup", parametrization="standard", model_learning_rates=rates))
    assert given.rates == dict.fromkeys(("standard", "fixed", "standard-wide"), 1e-3)
    for other in (dict(architecture="llama"), dict(hidden_size=64), dict(recipe="cpu-mlm"), dict(objective="mlm")):
        assert study.resolve(CompareOptions(preset="cpu-mup", **other)).options.model_learning_rates == (), other
    for same in (dict(parametrization="mup"), dict(steps=30), dict(seed=1)):
        assert study.resolve(CompareOptions(preset="cpu-mup", **same)).rates == mup.rates, same


def test_an_invalid_value_a_preset_gave_names_the_preset(tmp_path, capsys):
    """The value came from --preset, not from the user: the error says so, before the folder is made."""
    out = tmp_path / "never"
    assert main(["compare", "--preset", "cpu-mup", "--architecture", "llama", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--parametrization mup is an option of fixedhead's attention only" in err
    assert "(--preset cpu-mup sets --parametrization mup; give --parametrization to override it)" in err
    assert not out.exists()
    argv = ["scaling", "--preset", "tiny", "--hidden-sizes", "16", "30", "--output-dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "hidden_size 30 is not a multiple of --num-attention-heads 4" in err
    assert "(--preset tiny sets --num-attention-heads 2 4; give --num-attention-heads to override it)" in err
    assert not out.exists()
    # a value the user gave is the user's: no preset named
    argv = ["scaling", "--preset", "tiny", "--hidden-sizes", "16", "30", "--num-attention-heads", "2", "4"]
    assert main([*argv, "--output-dir", str(out)]) == 2
    assert "preset" not in capsys.readouterr().err.split("hidden_size 30")[1]


@pytest.mark.parametrize(
    "argv, suggested",
    [
        (["sweep", "--preset", "cpu-mlm", "--architecture", "llama"], "--preset cpu-clm or tiny-clm"),
        (["scaling", "--preset", "tiny", "--architecture", "llama"], "causal --recipe (cpu-clm, gpu-clm"),
    ],
)
def test_a_llama_refusal_suggests_an_option_the_command_has(argv, suggested, tmp_path, capsys):
    """Neither sweep nor scaling has --objective: the refusal names what they have."""
    out = tmp_path / "never"
    assert main([*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trains causal LMs only" in err and suggested in err and "objective" not in err and not out.exists()


def test_a_sweep_preset_is_named_options_it_starts_from(capsys):
    """As compare's, scaling's and widening's: --preset NAME runs exactly PRESETS[NAME], the options given override
    it, and --help lists every name."""
    from fixedhead.studies.sweep import PRESETS, SweepStudy

    study = SweepStudy()
    for name, preset in PRESETS.items():
        assert preset.preset == name and study.resolve(SweepOptions(preset=name)) == study.resolve(preset)
        assert study.resolve(SweepOptions(preset=name)).options.seeds == preset.seeds
        assert study.resolve(SweepOptions(preset=name, seeds=(7,))).options.seeds == (7,)
    assert PRESETS["cpu-mlm"].seeds == (0, 1, 2) and PRESETS["cpu-clm"].seeds == (0, 1)  # the committed sweeps'
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert f"--preset {{{','.join(PRESETS)}}}" in capsys.readouterr().out


def test_a_sweeps_description_is_written_from_the_points_it_trains():
    """The description names the points the options train (a subset of the models, an experiment, another family,
    μP), never a preset's prose about all of them."""
    from fixedhead.studies.sweep import SweepStudy

    study = SweepStudy()

    def describe(**options):
        return study.describe(study.resolve(SweepOptions(**options)))

    pair = describe(preset="cpu-clm", models=("d128-h32-dp4", "d128-h32-dp32-fixed"), architecture="llama")
    assert "heads at d=128 (standard h=32 vs fixed d_p=32, h=32)" in pair and "h=2" not in pair
    assert "every model as llama" in pair
    full = describe(preset="cpu-clm")
    assert "heads at d=128 (standard h=2, 32 vs fixed d_p=32, h=8, 32)" in full
    assert "standard d=192 (8 heads) vs fixed d=128, d_p=32, h=8, 32" in full
    sizes = describe(experiments=("head_size",), mup_base_head_dim=16)
    assert "head size 8, 16, 32, 64 at d=128, 8 heads" in sizes and "heads at" not in sizes
    assert "every model μP-style, based at d_p = 16" in sizes and "GLUE sst2 fine-tuning at 32 tokens" in sizes


def test_resolving_the_resolved_options_gives_the_same_spec():
    """plan.json records the spec's options; read back (a resumed or re-rendered study), they resolve to the same
    spec, for every study's presets and quick options."""
    from fixedhead.studies import STUDIES, study_class

    for name in STUDIES:
        study = study_class(name)()
        fields = {f.name: f for f in dataclasses.fields(study.Options)}
        presets = fields["preset"].metadata.get("choices", ()) if "preset" in fields else ()
        for options in (study.quick, study.Options(), *(study.Options(preset=p) for p in presets)):
            try:
                spec = study.resolve(options)
            except ValueError:  # finetune-sweep without a sweep folder
                continue
            again = study.resolve(getattr(spec, "options", spec))
            assert again == spec, (name, options)
