#!/usr/bin/env python
"""Pretrain one model for a wall-clock budget (e.g. a GPU slot of fixed length).

Usage: python examples/pretrain_timed.py --output-dir RUN_DIR --minutes 5 [fixedhead pretrain options]

The data are prepared once; a short calibration run (``--calibration-steps``, thrown away)
measures seconds per step on this machine, and the real run then gets the ``max_steps`` that
fits the budget, so its warm-up and linear decay end on time (stopping a run early on a timer
would leave the learning rate high). The budget covers the training steps; the
``--evaluations`` held-out evaluations and checkpoint saves come on top (on an H200, a 5-minute
budget took 307 s). Every option of ``fixedhead pretrain`` except ``--max-steps``,
``--eval-steps``, ``--save-steps`` (set from ``--minutes`` and ``--evaluations``), ``--resume``
and ``--preset`` is accepted and passed on.
"""

from __future__ import annotations

import argparse
import copy
import math
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from fixedhead.data import DEFAULT_CORPUS, DataSettings
from fixedhead.options import add_options, given
from fixedhead.training import ModelSettings, TrainSettings, prepare_data, pretrain
from fixedhead.training.identity import check_run_dir


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--minutes",
        type=float,
        required=True,
        help="budget for the training steps (data preparation, evaluations and checkpoint saves come on top)",
    )
    p.add_argument("--calibration-steps", type=int, default=200)
    p.add_argument("--evaluations", type=int, default=5, help="held-out evaluations during the run")
    add_options(p, ModelSettings, title="model")
    add_options(p, DataSettings, title="data")
    add_options(p, TrainSettings, skip=("progress",), title="training")
    args = p.parse_args(argv)
    for option in ("max_steps", "eval_steps", "save_steps"):
        if option in args:
            p.error(
                f"--{option.replace('_', '-')} is set from --minutes and --evaluations here; "
                "use `fixedhead pretrain` to choose it"
            )
    if not (math.isfinite(args.minutes) and args.minutes > 0):
        p.error(f"--minutes must be a positive number, got {args.minutes}")
    for option in ("calibration_steps", "evaluations"):
        if getattr(args, option) < 1:
            p.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    try:  # everything that can be refused is refused before the (slow) data preparation
        train = given(args, TrainSettings)
        report_to = TrainSettings(**train).report_to
        settings = TrainSettings(
            **{**train, "max_steps": args.calibration_steps, "report_to": [], "progress": False},
            eval_steps=10 * args.calibration_steps,
            save_steps=10 * args.calibration_steps,
        )
        data_settings = DataSettings(**{"corpus": str(DEFAULT_CORPUS), **given(args, DataSettings)})
        config = ModelSettings(**given(args, ModelSettings)).config(data_settings.max_seq_length)
        check_run_dir(Path(args.output_dir), {}, resume=False, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as e:
        p.error(str(e).replace("pass --resume to continue it or --overwrite", "pass --overwrite"))
    data = prepare_data(data_settings)

    scratch = tempfile.mkdtemp(prefix="fixedhead-calibration-")
    try:
        calib = pretrain(copy.deepcopy(config), data, scratch, settings)  # pretrain fills in the vocabulary
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    per_step = calib["train_seconds"] / args.calibration_steps  # includes start-up: errs on the short side
    steps = max(1, int(args.minutes * 60 / per_step))
    every = max(1, steps // args.evaluations)
    print(
        f"calibration: {args.calibration_steps} steps in {calib['train_seconds']} s ({per_step * 1000:.1f} ms/step); "
        f"budget {args.minutes} min -> max_steps {steps:,} "
        f"({steps * settings.batch_size * data.train.shape[1]:,} training tokens, "
        f"{steps * settings.batch_size / data.train.shape[0]:.1f} epochs)",
        flush=True,
    )
    settings = replace(
        settings, max_steps=steps, eval_steps=every, save_steps=every, report_to=report_to, progress=True
    )
    result = pretrain(config, data, args.output_dir, settings, overwrite=args.overwrite)
    print(
        f"held-out perplexity {result['heldout_perplexity']:.2f}, masked accuracy {result['heldout_accuracy']:.4f}, "
        f"{result['train_seconds']} s",
        flush=True,
    )
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
