"""``fixedhead pretrain`` and ``fixedhead count`` as library functions.

Each takes the options a user gave (``{field: value}`` of :class:`~fixedhead.training.ModelSettings`,
:class:`~fixedhead.data.DataSettings` and :class:`~fixedhead.training.TrainSettings`; a field left
out keeps its default), refuses options that contradict each other before any slow work, and
returns the result the command prints. Messages name the command-line options (``--hidden-size``
for ``hidden_size``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..data import DEFAULT_CORPUS, DataSettings, prepare_data
from .settings import ModelSettings, TrainSettings


def _options(fields) -> str:
    return ", ".join(sorted(f"--{f.replace('_', '-')}" for f in fields))


def _open_source(init_from, output_dir, model: dict, data: dict, train: dict, preset: str | None):
    """``--init-from``: refuse the options that would contradict the run, then open it."""
    from ..model.architectures import objective_of
    from ..runs import open_run

    refused = [*model, *(k for k in data if k != "corpus")] + ["preset"] * (preset is not None)
    if refused:
        raise ValueError(
            f"--init-from {init_from} continues that run's model on its recorded data; drop {_options(refused)} "
            f"(to change the head size, widen it first: fixedhead widen)"
        )
    if not Path(init_from).is_dir():
        raise FileNotFoundError(f"--init-from {str(init_from)!r}: no such run directory")
    if Path(init_from).resolve() == Path(output_dir).resolve():
        raise FileExistsError(f"--output-dir {str(output_dir)!r} is the run being continued; choose another folder")
    try:
        source = open_run(init_from)
    except (OSError, ValueError) as e:
        raise type(e)(f"--init-from {str(init_from)!r}: {e}") from None
    objective = objective_of(source.config)
    if train.get("objective", objective) != objective:
        raise ValueError(
            f"--init-from {init_from} holds a {'causal' if objective == 'clm' else 'masked'} LM; "
            f"drop --objective {train['objective']} (its objective, {objective}, is used)"
        )
    return objective


def _preset_config(preset: str, model: dict, max_seq_length: int):
    """A paper preset's config (``--dropout`` may change its dropout, nothing else) and objective."""
    from ..model.paper_presets import get_preset

    sizes = [k for k in model if k != "dropout"]
    if sizes:
        raise ValueError(f"--preset {preset} fixes the model size; drop {_options(sizes)} (or drop --preset)")
    p = get_preset(preset)
    dropout = model.get("dropout")
    config = p.build_config(
        **({} if dropout is None else dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    )
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(
            f"--max-seq-length {max_seq_length} exceeds preset {preset!r}'s "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    return config, p.objective


def pretrain_command(
    output_dir: str | os.PathLike,
    model: dict | None = None,
    data: dict | None = None,
    train: dict | None = None,
    preset: str | None = None,
    init_from: str | os.PathLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict:
    """Pretrain the model that the options describe (``fixedhead pretrain``) and return its metrics.

    The model is one of: a paper preset (``preset``; ``model`` may then hold only ``dropout``, and
    the objective defaults to the preset's), a run to continue (``init_from``: its model, objective
    and recorded data; ``data`` may hold only ``corpus``, where the corpus moved to), or
    :class:`ModelSettings` ``model`` trained from scratch. The corpus defaults to
    :data:`fixedhead.data.DEFAULT_CORPUS`. Every option is checked, and an occupied output folder
    refused, before the data is prepared.

    Raises:
        ValueError: contradicting or bad options (naming them).
        FileNotFoundError / FileExistsError: see :func:`~fixedhead.training.pretrain.pretrain`.
    """
    from ..model.architectures import check_objective_for
    from ..runs import PRETRAIN_FILE
    from .pretrain import check_run_dir, pretrain, source_data

    model, data, train = dict(model or {}), dict(data or {}), dict(train or {})
    config = None
    if init_from is not None:
        train["objective"] = _open_source(init_from, output_dir, model, data, train, preset)
    else:
        data.setdefault("corpus", str(DEFAULT_CORPUS))
        n = data.get("max_seq_length", DataSettings.max_seq_length)
        if preset is not None:
            config, objective = _preset_config(preset, model, n)
            train.setdefault("objective", objective)  # LM1B presets: causal, as the paper
        else:
            config = ModelSettings(**model).config(max_position_embeddings=n)
    settings = TrainSettings(**train)
    if config is not None:  # a Llama masked LM is refused before the corpus is looked at
        check_objective_for(config, settings.objective)
    data_settings = None if init_from is not None else DataSettings(**data)
    run_dir = Path(output_dir)
    if not (resume and not overwrite and (run_dir / PRETRAIN_FILE).is_file()):  # all but resuming needs no data
        check_run_dir(run_dir, {}, resume=resume, overwrite=overwrite)
    prepared = (
        source_data(init_from, corpus=data.get("corpus")) if init_from is not None else prepare_data(data_settings)
    )
    return pretrain(config, prepared, output_dir, settings, resume=resume, overwrite=overwrite, init_from=init_from)


#: ``count`` sizes a preset keeps its own values of when they are not given (and takes when they
#: are), with the defaults of explicit sizes (BERT-large's)
COUNT_DEFAULTS = {
    "num_hidden_layers": 24,
    "intermediate_size": None,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}


def count_table(presets: list[str] | None = None, sizes: dict | None = None) -> str:
    """``fixedhead count``: the parameter count of explicit sizes (``sizes`` with ``hidden_size``
    and ``num_attention_heads``; BERT-large's depth, vocabulary and positions unless given, a
    feed-forward of 4d) as one line, or a table of paper presets (default: all of Tables 1-3 and
    the LM1B-style ones) beside the counts the paper reports. ``sizes`` may change a preset's
    depth, feed-forward width, vocabulary and positions (the paper column is then left out).

    Raises:
        ValueError: ``hidden_size``, ``num_attention_heads`` or ``head_dim`` with presets, or
            explicit sizes without both of the first two; an unknown preset; a size the config refuses.
    """
    from ..model.configuration import FixedHeadConfig
    from ..model.modeling import count_parameters
    from ..model.paper_presets import PAPER_PRESETS, get_preset

    sizes = dict(sizes or {})
    fixed = [f for f in ("hidden_size", "num_attention_heads", "head_dim") if f in sizes]
    overrides = {f: v for f, v in sizes.items() if f in COUNT_DEFAULTS}
    if fixed and presets is not None:
        raise ValueError(f"--preset fixes d, h and d_p; drop {_options(fixed)} (or drop --preset)")
    if presets is None and sizes:
        missing = [f for f in ("hidden_size", "num_attention_heads") if f not in sizes]
        if missing:
            verb = "needs" if len(sizes) == 1 else "need"
            raise ValueError(f"{_options(sizes)} also {verb} {_options(missing)} (or --preset NAME)")
        d = sizes["hidden_size"]
        cfg = FixedHeadConfig(**{**COUNT_DEFAULTS, "intermediate_size": 4 * d, **sizes})
        return (
            f"{count_parameters(cfg):,} parameters: d={cfg.hidden_size}, h={cfg.num_attention_heads}, "
            f"d_p={cfg.head_size_label}, {cfg.num_hidden_layers} layers, feed-forward {cfg.intermediate_size}, "
            f"vocabulary {cfg.vocab_size}, {cfg.max_position_embeddings} positions (pooler and MLM head included)"
        )
    rows = [(name, get_preset(name)) for name in presets or list(PAPER_PRESETS)]  # unknown names refused first
    wn, ws = max(len(n) for n, _ in rows), max(len(p.source) for _, p in rows)  # columns as wide as their names
    lines = [f"{'preset':<{wn}} {'source':<{ws}} {'d':>5} {'h':>3} {'d_p':>4} {'params':>13} {'paper':>6} {'diff':>7}"]
    for name, p in rows:
        cfg = p.build_config(**overrides)
        n = count_parameters(cfg)
        paper_params = None if overrides else p.paper_params  # the paper counted the preset as it is
        diff = f"{100 * (n / 1e6 - paper_params) / paper_params:+.2f}%" if paper_params else ""
        paper = f"{paper_params:.0f}M" if paper_params else ""
        lines.append(
            f"{name:<{wn}} {p.source:<{ws}} {cfg.hidden_size:>5} {cfg.num_attention_heads:>3} "
            f"{cfg.head_size_label!s:>4} {n:>13,} {paper:>6} {diff:>7}"
        )
    if overrides:
        changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
        lines.append(
            f"({changed} in place of the preset's own; no paper column: the paper counted the presets as published)"
        )
    return "\n".join(lines)
