"""What each named sweep trains: the paper's three experiments as lists of points (model configurations),
their recipes and fine-tuning, and the transforms a sweep's options apply (another architecture, μP, a subset
of the models).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...checks import positive_int
from ...data import DEFAULT_CORPUS
from ...data.lm import DataSettings
from ...model.architectures import check_architecture
from ...training.finetune import FinetuneSettings
from ...training.settings import TrainSettings
from ..kit import core
from ..kit.recipes import get_recipe

EXPERIMENTS = ("heads", "embedding", "head_size")


@dataclass
class SweepPoint:
    """One point of one experiment's curve: ``series`` is ``"standard"`` or ``"fixed"``, ``x`` the swept
    quantity, ``model`` the config fields that differ from the preset's ``common`` ones."""

    experiment: str
    series: str
    x: int
    model: dict


@dataclass
class SweepPreset:
    """What the options of a sweep preset train: shared data/training/fine-tuning settings, common model fields and
    the points."""

    data: DataSettings
    train: TrainSettings
    common: dict
    points: list[SweepPoint]
    finetune: FinetuneSettings | None = None
    finetune_task: str = "sst2"
    smoke: str = ""
    """said first in the description of a preset whose numbers mean nothing"""


def canonical_fields(fields: dict) -> dict:
    """Config fields with a fixed head size equal to d/h rewritten as the standard layer (None), the same
    architecture (Theorem 2, first part), and ``intermediate_size`` 4·d when absent."""
    f = dict(fields)
    d, h = f["hidden_size"], f["num_attention_heads"]
    if f.get("head_dim") is not None and f["head_dim"] * h == d:
        f["head_dim"] = None
    f.setdefault("intermediate_size", 4 * d)
    return f


def model_key(fields: dict) -> str:
    """A model's folder name: ``d128-h16-dp8`` (standard) or ``d128-h16-dp32-fixed``, with ``-llama`` for a
    Llama-style model and ``-mupK`` under μP based at d_p = K."""
    f = canonical_fields(fields)
    d, h, dp = f["hidden_size"], f["num_attention_heads"], f.get("head_dim")
    key = f"d{d}-h{h}-dp{dp if dp is not None else d // h}" + ("-fixed" if dp is not None else "")
    if f["intermediate_size"] != 4 * d:
        key += f"-ffn{f['intermediate_size']}"
    if f.get("architecture", "fixedhead") != "fixedhead":
        key += f"-{f['architecture']}"
    if f.get("parametrization", "standard") != "standard":
        key += f"-{f['parametrization']}{f['mup_base_head_dim']}"
    return key


def _point(experiment: str, x: int, d: int, h: int, d_p: int | None = None) -> SweepPoint:
    """The point at ``x`` of a model of hidden size d and h heads: a fixed head size d_p, or standard (None)."""
    fixed = {"head_dim": d_p} if d_p is not None else {}
    return SweepPoint(
        experiment, "fixed" if fixed else "standard", x, dict(hidden_size=d, num_attention_heads=h, **fixed)
    )


def _points_heads(d, heads_std, heads_fixed, d_p):
    return [_point("heads", h, d, h) for h in heads_std] + [_point("heads", h, d, h, d_p) for h in heads_fixed]


def _points_embedding(ds_std, h_std, d_fixed, heads_fixed, d_p):
    standard = [_point("embedding", d, d, h_std) for d in ds_std]
    return standard + [_point("embedding", d_fixed, d_fixed, h, d_p) for h in heads_fixed]


def _points_head_size(d, h, head_dims):
    return [_point("head_size", dp, d, h, dp) for dp in head_dims]


def _common(layers: int, n: int) -> dict:
    # no intermediate_size: canonical_fields gives each model BERT's 4·d
    return dict(
        num_hidden_layers=layers, max_position_embeddings=n, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )


#: SST-2 fine-tuning of every checkpoint; lr 1e-3: at 3e-4 and 150 steps these small encoders
#: stayed at chance on SST-2 dev (measured)
_FINETUNE = dict(batch_size=32, learning_rate=1e-3, max_steps=200, eval_steps=50, patience=2, validation_size=400)
_FINETUNE_QUICK = dict(batch_size=16, learning_rate=3e-4, max_steps=8, eval_steps=4, patience=2, validation_size=100)


def _quick(description: str, **train) -> SweepPreset:
    """The tiny recipe (CI-sized, seconds per run; numbers mean nothing) on a few points of each experiment."""
    r = get_recipe("tiny")
    r = replace(r, train=replace(r.train, **train))  # the description says the objective it trains
    return SweepPreset(
        smoke=f"--quick {description}(CI-sized, seconds per run; numbers mean nothing): ",
        data=r.data,
        train=r.train,
        common=_common(r.layers, r.data.max_seq_length),
        points=_points_heads(32, [2, 8], [8], 16)
        + _points_embedding([32, 48], 8, 32, [8], 16)
        + _points_head_size(32, 4, [8, 16]),
        finetune=FinetuneSettings(
            max_seq_length=r.data.max_seq_length,
            max_train_examples=300,
            max_dev_examples=200,
            save_model=False,
            **_FINETUNE_QUICK,
        ),
    )


def _cpu_sweep() -> SweepPreset:
    """The original 300-step masked sweep (its models stay near the unigram plateau), ~1 h of 2 CPU cores;
    at n = 64 the standard layer at d = 128 is below d_p >= n for every h >= 2 (Theorem 1)."""
    data = DataSettings(
        corpus=str(DEFAULT_CORPUS),
        vocab_size=8192,
        max_seq_length=64,
        max_train_tokens=3_000_000,
        max_eval_tokens=100_000,
    )
    train = TrainSettings(
        batch_size=32, max_steps=300, learning_rate=2e-3, eval_steps=150, save_steps=300, report_to=[]
    )
    return SweepPreset(
        data=data,
        train=train,
        common=_common(2, 64),
        points=_points_heads(128, [2, 4, 8, 16, 32], [4, 8, 16, 32], 32)
        + _points_embedding([128, 160, 192], 8, 128, [4, 8, 16, 32], 32)
        + _points_head_size(128, 8, [8, 16, 32, 64]),
        finetune=FinetuneSettings(max_seq_length=64, max_train_examples=4000, save_model=False, **_FINETUNE),
    )


def _cpu_clm_sweep() -> SweepPreset:
    """The paper's LM1B claims (Fig. 1 and 3a) as causal LMs with the cpu-clm recipe, which ends about 1 nat
    below the unigram reference; no fine-tuning (the GLUE claims are the masked model's)."""
    r = get_recipe("cpu-clm")
    return SweepPreset(
        data=r.data,
        train=replace(r.train, logging_steps=25, report_to=[]),
        common=_common(r.layers, r.data.max_seq_length),
        points=_points_heads(128, [2, 32], [8, 32], 32) + _points_embedding([192], 8, 128, [8, 32], 32),
        finetune=None,
    )


def _cpu_mlm_sweep() -> SweepPreset:
    """The paper's BERT claims (Tables 1-3, Fig. 2) and masked-LM versions of Fig. 1/3a with the cpu-mlm
    recipe, which ends about 0.7 nats below the unigram reference. At n = 32 the standard layer at d = 128 is
    below d_p >= n for every h > 4 (Theorem 1). Fine-tuned on SST-2 at the pretraining length."""
    r = get_recipe("cpu-mlm")
    n = r.data.max_seq_length
    return SweepPreset(
        data=r.data,
        train=replace(r.train, logging_steps=50, eval_steps=1400, save_steps=1400, report_to=[]),
        common=_common(r.layers, n),
        points=_points_heads(128, [2, 8, 32], [8, 32], 32)
        + _points_embedding([128, 192], 8, 128, [8, 32], 32)
        + _points_head_size(128, 8, [8, 16, 32, 64]),
        finetune=FinetuneSettings(max_seq_length=n, max_train_examples=4000, save_model=False, **_FINETUNE),
    )


SWEEP_PRESETS = {
    "cpu-mlm": _cpu_mlm_sweep,
    "cpu-clm": _cpu_clm_sweep,
    "cpu": _cpu_sweep,
    # the seconds-sized sweeps of --quick: masked (with SST-2 fine-tuning) and causal
    "tiny": lambda: _quick("masked recipe ", mlm_probability=0.4),
    "tiny-clm": lambda: replace(_quick("causal ", objective="clm"), finetune=None),
}
#: the presets whose numbers mean nothing (their report's title says so)
QUICK_PRESETS = ("tiny", "tiny-clm")


def get_sweep_preset(name: str) -> SweepPreset:
    """Raises ValueError listing the known sweep presets."""
    return core.pick(SWEEP_PRESETS, name, "sweep")


def points_text(preset: SweepPreset) -> str:
    """The preset's points per experiment, in words: ``heads at d=128 (standard h=2, 32 vs fixed d_p=32, h=8,
    32); ...``."""

    def points(experiment, series):
        return [p for p in preset.points if p.experiment == experiment and p.series == series]

    def values(points, field):
        return ", ".join(map(str, sorted({p.model[field] for p in points})))

    def fixed(points, with_d=True):
        d = f"d={values(points, 'hidden_size')}, " if with_d else ""
        return f"fixed {d}d_p={values(points, 'head_dim')}, h={values(points, 'num_attention_heads')}"

    parts = []
    std, fix = points("heads", "standard"), points("heads", "fixed")
    if std or fix:
        sides = [f"standard h={values(std, 'num_attention_heads')}"] if std else []
        sides += [fixed(fix, with_d=False)] if fix else []
        parts.append(f"heads at d={values(std + fix, 'hidden_size')} ({' vs '.join(sides)})")
    std, fix = points("embedding", "standard"), points("embedding", "fixed")
    if std or fix:
        sides = [f"standard d={values(std, 'hidden_size')} ({values(std, 'num_attention_heads')} heads)"] if std else []
        parts.append(" vs ".join(sides + ([fixed(fix)] if fix else [])))
    if sizes := points("head_size", "fixed"):
        parts.append(
            f"head size {values(sizes, 'head_dim')} at d={values(sizes, 'hidden_size')}, "
            f"{values(sizes, 'num_attention_heads')} heads"
        )
    if (architecture := preset.common.get("architecture", "fixedhead")) != "fixedhead":
        parts.append(f"every model as {architecture}" + " (transformers' LlamaForCausalLM)" * (architecture == "llama"))
    if preset.common.get("parametrization", "standard") == "mup":
        parts.append(f"every model μP-style, based at d_p = {preset.common['mup_base_head_dim']}")
    return "; ".join(parts)


def as_architecture(preset: SweepPreset, architecture: str) -> SweepPreset:
    """The preset with every point a model of ``architecture`` (the same sizes); ValueError for an unknown one."""
    if preset.common.get("architecture", "fixedhead") == check_architecture(architecture):
        return preset
    return replace(preset, common={**preset.common, "architecture": architecture})


def as_mup(preset: SweepPreset, base_head_dim: int) -> SweepPreset:
    """The preset with every point under μP based at head size ``base_head_dim``
    (:mod:`fixedhead.model.parametrization`); ValueError for a ``base_head_dim`` that is not a positive int."""
    positive_int("mup_base_head_dim", base_head_dim)
    return replace(preset, common={**preset.common, "parametrization": "mup", "mup_base_head_dim": base_head_dim})


def only_models(preset: SweepPreset, models: list[str], name: str = "custom", experiments=None) -> SweepPreset:
    """The preset restricted to the points whose :func:`model_key` is one of ``models``; ValueError for an empty
    ``models`` or an unknown key, named with the known keys."""
    key = lambda pt: model_key({**preset.common, **pt.model})  # noqa: E731
    known = {key(pt) for pt in preset.points if not experiments or pt.experiment in experiments}
    if (bad := core.first_unknown(models, known)) is not None:
        where = f"experiments {', '.join(experiments)} of " if experiments else ""
        raise ValueError(
            f"model {bad!r} is not in {where}sweep preset {name!r} (its models: {', '.join(sorted(known))})"
        )
    return replace(preset, points=[pt for pt in preset.points if key(pt) in models])


def plan_runs(preset: SweepPreset, seeds, experiments=None) -> list[tuple[str, dict, int]]:
    """The distinct ``(key, model fields, seed)`` runs of a preset with ``seeds``, seed-major; ValueError for an
    unknown experiment name."""
    if experiments and (bad := core.first_unknown(experiments, EXPERIMENTS)) is not None:
        raise ValueError(f"unknown experiment {bad!r}; known: {', '.join(EXPERIMENTS)}")
    models: dict[str, dict] = {}
    for p in preset.points:
        if not experiments or p.experiment in experiments:
            fields = canonical_fields({**preset.common, **p.model})
            models.setdefault(model_key(fields), fields)
    return [(key, fields, seed) for (key, fields), seed in core.seed_major(models.items(), seeds)]
