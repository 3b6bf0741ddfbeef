"""``fixedhead pretrain`` and ``fixedhead count`` as library functions: each takes the options given (a field
left out keeps its default), refuses contradicting ones before any slow work, and names them as options
(``--hidden-size``)."""

from __future__ import annotations

import os
from pathlib import Path

from ..checks import in_range
from ..data import DEFAULT_CORPUS, DataSettings, prepare_data
from ..model.sizes import option_names
from .settings import ModelSettings, TrainSettings


def _open_source(init_from, output_dir, model: dict, data: dict, train: dict, preset: str | None):
    """``--init-from``: refuse the options that would contradict the run, then open it."""
    from ..model.architectures import objective_of
    from ..runs import open_run

    refused = [*model, *(k for k in data if k != "corpus")] + ["preset"] * (preset is not None)
    if refused:
        raise ValueError(
            f"--init-from {init_from} continues that run's model on its recorded data; drop {option_names(refused)} "
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
        raise ValueError(f"--preset {preset} fixes the model size; drop {option_names(sizes)} (or drop --preset)")
    p = get_preset(preset)
    dropout = model.get("dropout")
    if dropout is not None:
        in_range("dropout", dropout, 0.0, 1.0)  # the config would name its two fields
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
    """Pretrain the model the options describe (``fixedhead pretrain``) and return its metrics.

    The model is a paper preset (``model`` may hold only ``dropout``), a run to continue (``init_from``; ``data``
    may hold only a moved ``corpus``) or :class:`ModelSettings` from scratch. Every option is checked, and an
    occupied output folder refused, before the data is prepared (ValueError naming the options).
    """
    from ..model.architectures import check_objective_for
    from ..runs import PRETRAIN_FILE
    from .identity import check_run_dir
    from .pretrain import pretrain, source_data

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
