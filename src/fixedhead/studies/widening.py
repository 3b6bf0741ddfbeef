"""`fixedhead widen-experiment`: does widening the heads of a trained standard-head model help?

Bhojanapalli et al. (ICML 2020) fix the head size d_p independently of d and h. A model already
trained with standard heads (d_p = d/h, far below the sequence length n) can be grown to larger
heads exactly (:func:`fixedhead.widen_heads`: same function, new weights that learn). This
experiment asks whether that is worth doing: it trains one standard-head causal LM (the *base*),
then continues it for the same number of extra steps, with the same recipe and data, in several
*arms*:

* ``as-is``: the base model unchanged;
* ``wide-all``: every layer's heads widened to ``wide_head_dim`` (default: the generic causal
  threshold ⌈(n − 1)/2⌉ of :mod:`fixedhead.theory`, 16 for n = 32: the smallest head that can
  represent a generic causal attention pattern on n tokens exactly);
* ``wide-early`` / ``wide-late``: only the first / only the last half of the layers widened (the
  same parameter count as each other);
* ``ffn-matched``: the heads kept, every feed-forward layer widened instead (exactly, by the same
  scheme: new input rows random, new output columns zero) to the parameter count of ``wide-all``
  as nearly as whole units allow: is it the head size or just the added parameters?

Each arm is continued from ``seeds`` seeds; seed s sets the continuation's data order (the same
for every arm, so arms are compared on the same batches) and the new random weights of the
widened models. The base is one run (its own seed), so the spread over seeds is the continuation's
noise given that base, not the noise of training a base.

Every run is scored on every next token of the same held-out books, next to the unigram
reference (:func:`fixedhead.data.lm.unigram_perplexity`); parameters are
:func:`fixedhead.model.modeling.count_parameters` and training FLOPs :func:`fixedhead.model.flops.training_flops`.

**Verdict rule** (fixed before the committed run, :func:`compare_arms`): arm B against arm A is
*lower loss* if mean loss(A) − mean loss(B) > 2 × the pooled standard deviation
√((s_A² + s_B²)/2) over seeds, *higher loss* if it is < −2 × that, and *no measurable difference*
otherwise (one seed: *undecided*).

Outputs in the output folder: the runs (``base/``, ``start/ARM-sSEED/`` for the widened starting
models, ``continue/ARM-sSEED/``: git-ignored run folders with weights), ``results.json`` (every
run's metrics and training curve, rewritten atomically after each run, so an interrupted
experiment resumes and reuses finished runs), ``report.md`` and ``widening.png``.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..data import DataSettings
from ..runs import (
    METRICS_FILE,
    PRETRAIN_FILE,
    claim_output_dir,
    invocation_commands,
    load_json_file,
    write_json_atomic,
)
from ..theory import causal_threshold
from ..validation import non_negative_int, positive_int
from .report import mean_std

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "widening.png"
_OWNED = (RESULTS_FILE, REPORT_FILE, PLOT_FILE, "base", "start", "continue", f".{RESULTS_FILE}.*")

#: a difference of mean held-out losses counts when it exceeds this many pooled standard deviations
RULE_STDS = 2.0


# ----------------------------------------------------------------------------------- design
@dataclass(frozen=True)
class Arm:
    """One way to continue the base: per-layer head sizes (None = keep the layer's) and/or a
    feed-forward width; both None continues the base as it is."""

    name: str
    description: str
    head_dim: tuple[int | None, ...] | None = None
    intermediate_size: int | None = None


@dataclass
class WideningPreset:
    """The data, the base model, the two training recipes, the wide head size and the seeds.

    ``model`` holds :class:`~fixedhead.model.configuration.FixedHeadConfig` fields of a standard-head
    model (``head_dim=None``); ``base`` trains it from scratch; ``continuation`` is every arm's
    recipe (its ``seed`` is replaced by each of ``seeds``). Both must use ``objective="clm"``.
    """

    description: str
    data: DataSettings
    model: dict
    base: object  # TrainSettings
    continuation: object  # TrainSettings
    seeds: tuple[int, ...]
    wide_head_dim: int | None = None  # None: the generic causal threshold for n


def _recipes(base_steps: int, steps: int, batch: int, lr: float, logging: tuple[int, int]):
    from ..training import TrainSettings

    def recipe(max_steps, logging_steps, seed):
        return TrainSettings(
            batch_size=batch,
            max_steps=max_steps,
            learning_rate=lr,
            objective="clm",
            seed=seed,
            logging_steps=logging_steps,
            eval_steps=max_steps + 1,  # no Trainer evaluation: the held-out set is scored once, at the end
            save_steps=max_steps + 1,  # no checkpoints: a run takes minutes, an interrupted one starts again
            report_to=[],
        )

    return recipe(base_steps, logging[0], 0), recipe(steps, logging[1], 0)


def _cpu_preset() -> WideningPreset:
    from .compare import get_compare_preset

    cpu = get_compare_preset("cpu-mlm")  # its data and standard model are at n = 32, as this run was made
    base, cont = _recipes(400, 100, 128, 1e-3, (25, 10))
    return WideningPreset(
        description="The compare presets' standard model as a causal LM (d = 128, h = 16, d_p = 8, 2 layers, FFN 512, "
        "n = 32, vocabulary 8,192, no dropout; Gutenberg books), 400 steps, then 100 more steps per arm",
        data=cpu.data,
        model=dict(cpu.models["standard"]),
        base=base,
        continuation=cont,
        seeds=(1, 2, 3),
    )


def _tiny_preset() -> WideningPreset:
    from .compare import get_compare_preset

    tiny = get_compare_preset("tiny")
    base, cont = _recipes(20, 10, 16, 2e-3, (5, 5))
    return WideningPreset(
        description="a seconds-long smoke test (numbers mean nothing): d = 32, h = 8 (d_p = 4), 2 layers, "
        "vocabulary 500; 20 base steps, 10 per arm",
        data=tiny.data,
        model=dict(tiny.models["standard"], num_hidden_layers=2),
        base=base,
        continuation=cont,
        seeds=(1,),
    )


WIDENING_PRESETS = {"cpu": _cpu_preset, "tiny": _tiny_preset}


def get_widening_preset(name: str) -> WideningPreset:
    """Raises ValueError listing the known presets."""
    from ..model.paper_presets import lookup

    return lookup(WIDENING_PRESETS, name, "widen-experiment")()


def _base_config(p: WideningPreset, vocab_size: int):
    from ..model.configuration import FixedHeadConfig

    return FixedHeadConfig(**p.model, vocab_size=vocab_size)


def matched_intermediate_size(config, target_params: int) -> int:
    """The feed-forward width (same for every layer, ≥ the config's) whose parameter count is
    nearest to ``target_params`` (counted as :func:`~fixedhead.model.modeling.count_parameters` without
    pooler); ties go to the smaller width."""
    from ..model.modeling import count_parameters

    def params(f):
        return count_parameters(replace_config(config, intermediate_size=f), pooler=False)

    f = config.intermediate_size
    while params(f + 1) <= target_params:
        f += 1
    return f + 1 if abs(params(f + 1) - target_params) < abs(params(f) - target_params) else f


def replace_config(config, **fields):
    """A copy of a config with ``fields`` changed."""
    c = copy.deepcopy(config)
    for k, v in fields.items():
        setattr(c, k, v)
    return c


def make_arms(config, wide_head_dim: int) -> list[Arm]:
    """The arms for a base ``config`` (standard heads) and the wide head size (see the module docstring).

    Raises:
        ValueError: ``wide_head_dim`` not larger than the base's head size.
    """
    from ..model.modeling import count_parameters

    layers = config.num_hidden_layers
    old = config.layer_head_dims
    if positive_int("wide_head_dim", wide_head_dim) <= max(old):
        raise ValueError(
            f"wide_head_dim={wide_head_dim} must be larger than the base's head size {max(old)}: "
            "widening to the same size changes nothing"
        )
    w = wide_head_dim
    arms = [
        Arm("as-is", f"the base model as it is (d_p = {old[0]} in every layer)"),
        Arm("wide-all", f"every layer's heads widened to d_p = {w}", head_dim=(w,) * layers),
    ]
    if layers >= 2:
        k = layers // 2
        arms += [
            Arm(
                "wide-early",
                f"the first {f'{k} layers' if k > 1 else 'layer'}'s heads widened to d_p = {w}",
                head_dim=(w,) * k + (None,) * (layers - k),
            ),
            Arm(
                "wide-late",
                f"the last {f'{k} layers' if k > 1 else 'layer'}'s heads widened to d_p = {w}",
                head_dim=(None,) * (layers - k) + (w,) * k,
            ),
        ]
    wide_params = count_parameters(replace_config(config, head_dim=[w] * layers), pooler=False)
    f = matched_intermediate_size(config, wide_params)
    arms.append(
        Arm(
            "ffn-matched",
            f"heads kept (d_p = {old[0]}); every feed-forward layer widened {config.intermediate_size} → {f}, "
            f"the parameter count of wide-all",
            intermediate_size=f,
        )
    )
    return arms


# --------------------------------------------------------------------------- starting models
@torch.no_grad()
def widen_feed_forward(model, intermediate_size: int, *, init_std: float | None = None, seed: int = 0):
    """A copy of a fixedhead language model whose feed-forward layers are ``intermediate_size``
    wide and which computes the same function (the parameter-matched control of this experiment).

    Per layer, the new units' input rows are N(0, init_std²) (default: ``initializer_range``) with
    zero bias, and their output columns are zero, so they add nothing until trained; as in
    :func:`fixedhead.widen_heads`, one side of each product is random, so every new weight learns.

    Raises:
        ValueError: ``intermediate_size`` smaller than the model's.
    """
    old = model.config.intermediate_size
    if positive_int("intermediate_size", intermediate_size) < old:
        raise ValueError(f"intermediate_size={intermediate_size} is smaller than the model's {old}")
    std = init_std if init_std is not None else model.config.initializer_range
    generator = torch.Generator().manual_seed(seed)
    wide = type(model)(replace_config(model.config, intermediate_size=intermediate_size))
    source = model.state_dict()
    state = {}
    for name, target in wide.state_dict().items():
        w = source[name]
        if w.shape == target.shape:
            state[name] = w.clone()
        elif name.endswith("intermediate.weight"):  # [f, d]: new rows random
            new = torch.randn(target.shape[0] - w.shape[0], w.shape[1], generator=generator) * std
            state[name] = torch.cat([w, new.to(w.dtype)])
        elif name.endswith("intermediate.bias"):  # [f]: new entries 0
            state[name] = torch.cat([w, w.new_zeros(target.shape[0] - w.shape[0])])
        elif name.endswith("output.weight"):  # [d, f]: new columns 0
            state[name] = torch.cat([w, w.new_zeros(w.shape[0], target.shape[1] - w.shape[1])], 1)
        else:
            raise ValueError(f"unexpected parameter {name} of shape {tuple(w.shape)} → {tuple(target.shape)}")
    wide.load_state_dict(state)
    wide.train(model.training)
    return wide


def _write_start(base_dir: Path, arm: Arm, seed: int, out: Path) -> None:
    """The starting model of ``arm`` for ``seed`` in ``out``: a ``fixedhead widen`` output (heads), or
    the same kind of folder with the feed-forward layers widened; rewritten every time (it is
    deterministic, so a finished continuation's record of its content still matches)."""
    from ..runs import follow_umask, open_run, resolve_local_path
    from ..training.evaluate import load_model
    from ..training.widen import WIDEN_FILE, widen_run

    if arm.head_dim is not None:
        widen_run(base_dir, list(arm.head_dim), out, seed=seed, overwrite=True)
        return
    run = open_run(base_dir)
    model = load_model(run)
    wide = widen_feed_forward(model, arm.intermediate_size, seed=seed)
    owned = (WIDEN_FILE, "*.json", "*.safetensors", "vocab.txt", ".*.tmp*")
    out = claim_output_dir(out, (WIDEN_FILE,), owned, "widen-experiment", overwrite=True)
    write_json_atomic(
        out / WIDEN_FILE,
        {
            "source_run": resolve_local_path(base_dir),
            "objective": "clm" if run.config.is_decoder else "mlm",
            "old_head_dims": run.config.layer_head_dims,
            "new_head_dims": wide.config.layer_head_dims,
            "old_intermediate_size": run.config.intermediate_size,
            "new_intermediate_size": wide.config.intermediate_size,
            "seed": seed,
            "init_std": run.config.initializer_range,
            "source_settings": run.settings,
        },
    )
    wide.save_pretrained(str(out), safe_serialization=True)
    follow_umask(out / "model.safetensors")
    run.tokenizer.save_pretrained(str(out))


@torch.no_grad()
def _max_logit_change(base_model, start_dir: Path, ids: torch.Tensor) -> float:
    """max |Δ logits| between the base and a starting model on ``ids`` (eval mode, float32)."""
    from ..runs import open_run
    from ..training.evaluate import load_model

    start = load_model(open_run(start_dir)).eval()
    return float((start(input_ids=ids).logits - base_model(input_ids=ids).logits).abs().max())


# ----------------------------------------------------------------------------------- verdict
def compare_arms(losses_a: list[float], losses_b: list[float]) -> dict:
    """The verdict rule: B against A on held-out loss (nats; lower is better).

    Returns:
        ``{"difference": mean(A) − mean(B) (> 0: B has the lower loss), "pooled_std":
        √((s_A² + s_B²)/2), "threshold": RULE_STDS × pooled_std, "verdict": "lower loss",
        "higher loss", "no measurable difference" or "undecided (one seed)"}``.
    """
    ma, sa = mean_std(losses_a)
    mb, sb = mean_std(losses_b)
    pooled = math.sqrt((sa**2 + sb**2) / 2)
    diff = ma - mb
    if not math.isfinite(pooled):
        verdict = "undecided (one seed)"
    elif diff > RULE_STDS * pooled:
        verdict = "lower loss"
    elif diff < -RULE_STDS * pooled:
        verdict = "higher loss"
    else:
        verdict = "no measurable difference"
    return {"difference": diff, "pooled_std": pooled, "threshold": RULE_STDS * pooled, "verdict": verdict}


#: the questions of the report: (B, A, what B against A asks)
COMPARISONS = [
    ("wide-all", "as-is", "does widening every layer's heads help?"),
    ("wide-early", "as-is", "does widening only the early layers help?"),
    ("wide-late", "as-is", "does widening only the late layers help?"),
    ("wide-early", "wide-late", "early or late layers (equal parameters)?"),
    ("ffn-matched", "as-is", "do the same extra parameters in the feed-forward layers help?"),
    ("wide-all", "ffn-matched", "heads or feed-forward, at (nearly) equal parameters?"),
]


# ------------------------------------------------------------------------------------ runner
def _fingerprint(p: WideningPreset, wide_head_dim: int) -> dict:
    """What must match for stored runs to be reused: data, model, both recipes (seeds aside), wide size."""
    import json

    def recipe(t):
        return {k: v for k, v in asdict(t).items() if k not in ("seed", "progress")}

    return json.loads(
        json.dumps(
            {
                "data": asdict(p.data),
                "model": p.model,
                "base": {**recipe(p.base), "seed": p.base.seed},
                "continuation": recipe(p.continuation),
                "wide_head_dim": wide_head_dim,
            },
            default=str,
        )
    )


def _same_settings(saved: dict | None, fingerprint: dict) -> bool:
    """A saved fingerprint against the current one, training fields added since compared at their
    old default (:func:`fixedhead.training.pretrain.with_later_defaults`)."""
    from ..training.pretrain import with_later_defaults

    def normal(f):
        return {k: with_later_defaults(v) if k in ("base", "continuation") else v for k, v in f.items()}

    return isinstance(saved, dict) and normal(saved) == normal(fingerprint)


def run_widening(
    preset: str | WideningPreset = "cpu",
    output_dir: str | Path = "runs/widen-experiment",
    seeds: list[int] | None = None,
    base_steps: int | None = None,
    steps: int | None = None,
    wide_head_dim: int | None = None,
    corpus: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_dir=None,
    command: str | None = None,
) -> dict:
    """Train the base, continue it in every arm for every seed (or reuse finished runs); write the
    results, the report and the plot.

    Args:
        preset: a name from :data:`WIDENING_PRESETS` or a :class:`WideningPreset`.
        output_dir: a new or empty folder, or an earlier output of this experiment.
        seeds: continuation seeds (default: the preset's); runs of other seeds already in the
            folder are kept in ``results.json`` but only these are reported.
        base_steps, steps: override the base's and each continuation's training steps.
        wide_head_dim: the widened head size (default: the preset's, else ⌈(n − 1)/2⌉).
        corpus: another corpus path (the same text, e.g. moved).
        overwrite: delete this experiment's earlier runs and results in the folder first.

    Returns:
        The content of ``results.json``: ``meta``, ``unigram_perplexity``, ``base`` and ``runs``.

    Raises:
        ValueError: bad seeds, steps or sizes, or a preset that is not a causal standard-head model.
        FileExistsError: the folder holds other files, or runs of other settings (without ``overwrite``).
    """
    from ..data import prepare_data
    from ..data.lm import unigram_perplexity
    from ..model.flops import training_flops
    from ..model.modeling import count_parameters
    from ..runs import environment_info, open_run
    from ..training.evaluate import load_model
    from ..training.pretrain import lm_config, pretrain

    p = copy.deepcopy(get_widening_preset(preset) if isinstance(preset, str) else preset)
    if seeds is not None:
        if not seeds:
            raise ValueError("seeds must name at least one seed")
        p.seeds = tuple(dict.fromkeys(non_negative_int("seed", s) for s in seeds))
    if base_steps is not None:
        positive_int("base_steps", base_steps)
        p.base = replace(p.base, max_steps=base_steps, eval_steps=base_steps + 1, save_steps=base_steps + 1)
    if steps is not None:
        positive_int("steps", steps)
        p.continuation = replace(p.continuation, max_steps=steps, eval_steps=steps + 1, save_steps=steps + 1)
    if corpus is not None:
        p.data = replace(p.data, corpus=corpus)
    for name, t in (("base", p.base), ("continuation", p.continuation)):
        if t.objective != "clm":
            raise ValueError(f"the {name} recipe must use objective='clm', got {t.objective!r}")
    n = p.data.max_seq_length
    wide = wide_head_dim if wide_head_dim is not None else (p.wide_head_dim or causal_threshold(n))
    probe = _base_config(p, p.data.vocab_size)
    if probe.is_fixed_head:
        raise ValueError(f"the base model must have standard heads (head_dim=None), got {probe.head_dim!r}")
    arms = make_arms(probe, wide)  # refuses a bad wide size before anything is written
    name = preset if isinstance(preset, str) else "custom"

    out = Path(output_dir)
    claim_output_dir(out, (RESULTS_FILE,), _OWNED, "widen-experiment", create=False)
    state_file = out / RESULTS_FILE
    fingerprint = _fingerprint(p, wide)
    previous: dict = {}
    if state_file.is_file() and not overwrite:
        previous = load_json_file(state_file, "widen-experiment results")
        if not _same_settings(previous.get("meta", {}).get("settings"), fingerprint):
            raise FileExistsError(
                f"{state_file} holds runs of other settings (data, model, recipes or wide head size); pass "
                f"--overwrite to replace them or choose another --output-dir"
            )
    data = prepare_data(p.data, cache_dir=cache_dir, progress=progress)  # a bad corpus leaves nothing behind
    out = claim_output_dir(out, (RESULTS_FILE,), _OWNED, "widen-experiment", overwrite=overwrite)

    previous_meta = previous.get("meta", {})
    this_command, commands = invocation_commands(command, previous_meta)
    now = time.time()
    config = lm_config(_base_config(p, len(data.tokenizer)), data.tokenizer, "clm")
    arms = make_arms(config, wide)
    tokens = p.continuation.max_steps * p.continuation.batch_size * n
    meta = {
        "preset": name,
        "description": p.description,
        "settings": fingerprint,
        "command": this_command,
        "commands": commands,
        "seeds": list(p.seeds),
        "n": n,
        "wide_head_dim": wide,
        "causal_threshold": causal_threshold(n),
        "arms": [asdict(a) for a in arms],
        "rule": {"stds": RULE_STDS},
        "continuation_tokens": tokens,
        "first_started": previous_meta.get("first_started", now),
        "invocation_started": now,
        "data_info": {k: v for k, v in data.info.items() if k != "prepare_seconds"},
        **environment_info(),
    }
    state = {
        "meta": meta,
        "unigram_perplexity": unigram_perplexity(data, p.base.eval_seed, "clm"),
        "base": previous.get("base"),
        "runs": previous.get("runs", {}),
    }

    def save():
        meta["total_seconds"] = round(time.time() - meta["first_started"], 1)
        runs = [state["base"]] if state["base"] else []
        meta["compute_seconds"] = round(sum(r["train_seconds"] for r in runs + list(state["runs"].values())), 1)
        write_json_atomic(state_file, state)

    save()  # the marker first: an interrupted experiment's folder is recognised as its own

    base_dir = out / "base"
    plan = [(arm, seed) for seed in p.seeds for arm in arms]  # seed-major: every arm once first
    if progress:
        print(
            f"\n[base] {base_dir}: d={config.hidden_size}, h={config.num_attention_heads}, "
            f"d_p={config.head_size_label}, {count_parameters(config, pooler=False):,} parameters, "
            f"{p.base.max_steps} steps; then {len(plan)} continuations of {p.continuation.max_steps} steps",
            flush=True,
        )
    base_train = replace(p.base, progress=progress)
    base = pretrain(config, data, base_dir, base_train, resume=(base_dir / PRETRAIN_FILE).is_file())
    state["base"] = {
        **{k: v for k, v in base.items() if k != "eval_curve"},
        "flops": training_flops(config, base["training_tokens"], n),
    }
    save()
    if progress:
        print(f"[base] held-out loss {base['heldout_loss']:.4f} (ppl {base['heldout_perplexity']:.1f})", flush=True)

    base_model = load_model(open_run(base_dir)).eval()
    probe_ids = data.heldout[:16]
    for i, (arm, seed) in enumerate(plan, 1):
        key = f"{arm.name}-s{seed}"
        run_dir = out / "continue" / key
        if key in state["runs"] and (run_dir / METRICS_FILE).is_file():
            continue
        if arm.head_dim is None and arm.intermediate_size is None:
            start, change = base_dir, 0.0
        else:
            start = out / "start" / key
            _write_start(base_dir, arm, seed, start)
            change = _max_logit_change(base_model, start, probe_ids)
        train = replace(p.continuation, seed=seed, progress=progress)
        result = pretrain(None, data, run_dir, train, resume=(run_dir / PRETRAIN_FILE).is_file(), init_from=start)
        run_config = _load_model_config(run_dir)
        state["runs"][key] = {
            **{k: v for k, v in result.items() if k not in ("eval_curve", "init_from")},
            # the start as a path inside the output folder (results.json stays true when the folder moves)
            "init_from": {"path": start.relative_to(out).as_posix(), **without_path(result["init_from"])},
            "arm": arm.name,
            "seed": seed,
            "layer_head_dims": run_config.layer_head_dims,
            "intermediate_size": run_config.intermediate_size,
            "flops": training_flops(run_config, result["training_tokens"], n),
            "start_max_logit_change": change,
        }
        save()
        if progress:
            print(
                f"[{i}/{len(plan)}] {key}: d_p {run_config.layer_head_dims}, FFN {run_config.intermediate_size}, "
                f"{result['parameters']:,} parameters; held-out loss {result['heldout_loss']:.4f} "
                f"(ppl {result['heldout_perplexity']:.1f}); start max |Δlogits| {change:.1e}; "
                f"{result['train_seconds']:.0f} s",
                flush=True,
            )
    save()
    write_outputs(state, out)
    if progress:
        print()
        print(format_table(state))
    return state


def without_path(record: dict) -> dict:
    """A run's ``init_from`` record without its absolute ``path``."""
    return {k: v for k, v in record.items() if k != "path"}


def _load_model_config(run_dir: Path):
    from ..runs import open_run

    return open_run(run_dir).config


# ----------------------------------------------------------------------------------- outputs
def _arm_runs(state: dict, arm: str) -> list[dict]:
    seeds = state["meta"]["seeds"]
    return sorted(
        (r for r in state["runs"].values() if r["arm"] == arm and r["seed"] in seeds), key=lambda r: r["seed"]
    )


def summarize(state: dict) -> list[dict]:
    """One row per arm: sizes, parameters, FLOPs, held-out loss and perplexity (mean ± std over
    seeds), nats below the unigram reference, per-seed losses."""
    unigram = math.log(state["unigram_perplexity"])
    rows = []
    as_is = _arm_runs(state, "as-is")
    as_is_by_seed = {r["seed"]: r["heldout_loss"] for r in as_is}
    for arm in state["meta"]["arms"]:
        rs = _arm_runs(state, arm["name"])
        if not rs:
            rows.append({"arm": arm["name"], "runs": 0, "description": arm["description"]})
            continue
        losses = [r["heldout_loss"] for r in rs]
        m, s = mean_std(losses)
        ppl_m, ppl_s = mean_std([r["heldout_perplexity"] for r in rs])
        rows.append(
            {
                "arm": arm["name"],
                "description": arm["description"],
                "runs": len(rs),
                "seeds": [r["seed"] for r in rs],
                "layer_head_dims": rs[0]["layer_head_dims"],
                "intermediate_size": rs[0]["intermediate_size"],
                "parameters": rs[0]["parameters"],
                "extra_parameters": rs[0]["parameters"] - as_is[0]["parameters"] if as_is else None,
                "flops": rs[0]["flops"],
                "flops_ratio": rs[0]["flops"] / as_is[0]["flops"] if as_is else None,
                "loss_mean": m,
                "loss_std": s,
                "ppl_mean": ppl_m,
                "ppl_std": ppl_s,
                "below_unigram": unigram - m,
                "losses": losses,
                # descriptive, not the verdict rule: the same seed means the same batches in every arm
                "paired_differences": [
                    r["heldout_loss"] - as_is_by_seed[r["seed"]] for r in rs if r["seed"] in as_is_by_seed
                ],
                "accuracy_mean": mean_std([r["heldout_accuracy"] for r in rs])[0],
                "start_max_logit_change": max(r["start_max_logit_change"] for r in rs),
                "train_seconds_mean": mean_std([r["train_seconds"] for r in rs])[0],
            }
        )
    return rows


def comparisons(state: dict) -> list[dict]:
    """:data:`COMPARISONS` with :func:`compare_arms` applied (only pairs whose arms both ran)."""
    names = {a["name"] for a in state["meta"]["arms"]}
    out = []
    for b, a, question in COMPARISONS:
        if a not in names or b not in names:
            continue
        la = [r["heldout_loss"] for r in _arm_runs(state, a)]
        lb = [r["heldout_loss"] for r in _arm_runs(state, b)]
        if la and lb:
            out.append({"b": b, "a": a, "question": question, **compare_arms(la, lb)})
    return out


def _pm(m: float, s: float, digits: int = 4) -> str:
    if not math.isfinite(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f} (1 seed)"


def format_table(state: dict) -> str:
    """A plain-text table of the arms (mean ± std over seeds) and the verdicts."""
    rows = summarize(state)
    base = state.get("base") or {}
    unigram = state["unigram_perplexity"]
    lines = [
        f"{'arm':<12} {'d_p per layer':>14} {'FFN':>5} {'params':>10} {'FLOPs x':>8} "
        f"{'held-out loss':>17} {'ppl':>15} {'below unigram':>13}",
    ]
    if base:
        lines.append(
            f"{'base':<12} {str(base.get('head_dim')):>14} {'':>5} {base['parameters']:>10,} {'':>8} "
            f"{base['heldout_loss']:>17.4f} {base['heldout_perplexity']:>15.1f} "
            f"{math.log(unigram) - base['heldout_loss']:>13.3f}"
        )
    for r in rows:
        if not r["runs"]:
            lines.append(f"{r['arm']:<12} (not run)")
            continue
        lines.append(
            f"{r['arm']:<12} {str(r['layer_head_dims']):>14} {r['intermediate_size']:>5} {r['parameters']:>10,} "
            f"{r['flops_ratio']:>8.3f} {_pm(r['loss_mean'], r['loss_std']):>17} "
            f"{_pm(r['ppl_mean'], r['ppl_std'], 1):>15} {r['below_unigram']:>13.3f}"
        )
    lines.append(
        f"unigram reference on the same held-out next tokens: ppl {unigram:.1f} (loss {math.log(unigram):.4f}); "
        f"mean ± std over seeds {state['meta']['seeds']}; FLOPs x = continuation training FLOPs / as-is"
    )
    for c in comparisons(state):
        lines.append(
            f"{c['b']} vs {c['a']}: {c['a']} − {c['b']} = {c['difference']:+.4f} nats, "
            f"{RULE_STDS:g} x pooled std = {c['threshold']:.4f}: {c['verdict']}"
        )
    return "\n".join(lines)


def write_outputs(state: dict, out: Path) -> None:
    """``report.md`` and ``widening.png`` in ``out`` (``results.json`` is written as runs finish)."""
    from ..runs import write_text_atomic

    plot(state, out / PLOT_FILE)
    write_text_atomic(out / REPORT_FILE, report_markdown(state))


def plot(state: dict, path: Path) -> None:
    """Left: each arm's held-out loss minus the mean of *as-is* (each seed a dot, mean ± std a bar).
    Right: each arm's training loss minus *as-is*'s on the same batches (same seed), mean over seeds."""
    from ..plotting import pyplot, save_figure

    plt = pyplot()
    rows = [r for r in summarize(state) if r["runs"]]
    as_is = next((r for r in rows if r["arm"] == "as-is"), None)
    if as_is is None:
        return
    ref = as_is["loss_mean"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    ax = axes[0]
    for i, r in enumerate(rows):
        c = colours[i % len(colours)]
        ax.scatter([i - 0.08] * len(r["losses"]), [x - ref for x in r["losses"]], color=c, s=16, alpha=0.7)
        std = r["loss_std"] if math.isfinite(r["loss_std"]) else 0.0
        ax.errorbar([i + 0.08], [r["loss_mean"] - ref], yerr=[std], color=c, marker="o", capsize=4)
    ax.axhline(0.0, color="gray", linewidth=1)
    ax.set_xticks(range(len(rows)), [f"{r['arm']}\n{r['parameters'] / 1e6:.3f}M" for r in rows], fontsize=8)
    ax.set_ylabel("held-out loss − as-is mean (nats; < 0 is better)")
    base = state.get("base") or {}
    ax.set_title(
        f"after the continuation (dots: seeds; bar: mean ± std)\nas-is {ref:.4f} nats"
        + (f"; the base before it {base['heldout_loss']:.4f}" if base else ""),
        fontsize=9,
    )
    ax = axes[1]
    reference = {r["seed"]: dict(map(tuple, r["train_curve"])) for r in _arm_runs(state, "as-is")}
    for i, r in enumerate(rows):
        if r["arm"] == "as-is":
            continue
        diffs = []
        for run in _arm_runs(state, r["arm"]):
            if run["seed"] in reference:
                curve = dict(map(tuple, run["train_curve"]))
                diffs.append(
                    {s: v - reference[run["seed"]][s] for s, v in curve.items() if s in reference[run["seed"]]}
                )
        steps = sorted(set.intersection(*(set(d) for d in diffs))) if diffs else []
        if steps:
            ax.plot(
                steps,
                [sum(d[s] for d in diffs) / len(diffs) for s in steps],
                color=colours[i % len(colours)],
                marker=".",
                label=r["arm"],
            )
    ax.axhline(0.0, color="gray", linewidth=1)
    ax.set_xlabel("continuation step")
    ax.set_ylabel("training loss − as-is's, same batches (nats)")
    ax.set_title("training loss against as-is during the continuation (mean over seeds)", fontsize=9)
    fig.suptitle(state["meta"]["description"], fontsize=8)
    save_figure(fig, path, [axes[1]])


def report_markdown(state: dict) -> str:
    """The markdown report: what was run, the rule, the table, the comparisons and the verdict."""
    meta, base = state["meta"], state.get("base") or {}
    settings = meta["settings"]
    cont, base_recipe = settings["continuation"], settings["base"]
    rows = summarize(state)
    comps = comparisons(state)
    unigram = state["unigram_perplexity"]
    n_done = sum(r["runs"] for r in rows)
    n_plan = len(meta["arms"]) * len(meta["seeds"])
    model = settings["model"]
    L = [
        "# Does widening the heads of a trained standard-head model help?",
        "",
        f"{meta['description']}.",
        "",
    ]
    if n_done < n_plan or not base:
        L += [f"**Incomplete: {n_done} of {n_plan} continuations finished.** Rerun the same command to finish.", ""]
    L += [
        f"![held-out loss per arm and training curves]({PLOT_FILE})",
        "",
        "## What was run",
        "",
        "- command" + ("s" if len(meta["commands"]) > 1 else "") + ": " + ", ".join(f"`{c}`" for c in meta["commands"]),
        f"- wall time: {meta['total_seconds'] / 60:.1f} min from the first start to the last result; the runs' own "
        f"training time sums to {meta['compute_seconds'] / 60:.1f} min; {meta.get('cpu_count')} CPU cores "
        f"({meta.get('platform', '')}), torch threads {meta.get('torch_threads')}",
        f"- software: Python {meta['python']}, torch {meta['torch']}, transformers {meta['transformers']}"
        + "".join(f", {k} {v}" for k, v in (meta.get("other_versions") or {}).items() if v),
        f"- data: {Path(settings['data']['corpus']).name}, {meta['data_info']['train_documents']} training "
        f"documents ({meta['data_info']['train_sequences']:,} sequences of n = {meta['n']}), held out: "
        f"{'; '.join(meta['data_info']['heldout_documents'])} ({meta['data_info']['heldout_sequences']:,} "
        f"sequences, every next token scored); WordPiece vocabulary {meta['data_info']['vocab_size']:,}",
        f"- base: a causal LM with standard heads, d = {model['hidden_size']}, h = {model['num_attention_heads']}, "
        f"d_p = d/h = {model['hidden_size'] // model['num_attention_heads']}, {model['num_hidden_layers']} layers, "
        f"FFN {model['intermediate_size']}, dropout {model.get('hidden_dropout_prob', 0.1)}; "
        f"{base_recipe['max_steps']} steps × {base_recipe['batch_size']} sequences, AdamW lr "
        f"{base_recipe['learning_rate']}, warm-up {base_recipe['warmup_ratio']:.0%} then linear decay, seed "
        f"{base_recipe['seed']}",
        f"- every continuation: {cont['max_steps']} more steps × {cont['batch_size']} sequences "
        f"({meta['continuation_tokens']:,} tokens) from the base's weights with a fresh optimizer and the same "
        f"recipe (lr {cont['learning_rate']}, warm-up {cont['warmup_ratio']:.0%} then linear decay)",
        f"- seeds {meta['seeds']}: seed s is the continuation's data order (the same batches in every arm) and "
        f"the new random weights of a widened model; the base is one run, so the spread over seeds is the "
        f"continuation's noise given this base",
        f"- wide head size d_p = {meta['wide_head_dim']}"
        + (
            f" = ⌈(n − 1)/2⌉, the generic causal threshold for n = {meta['n']} (docs/theory.md): a causal head "
            f"of this size can represent a generic causal attention pattern on {meta['n']} tokens exactly"
            if meta["wide_head_dim"] == meta["causal_threshold"]
            else f" (the generic causal threshold for n = {meta['n']} is {meta['causal_threshold']})"
        ),
        "",
        "| arm | what changes at the start |",
        "|---|---|",
        *[f"| {a['name']} | {a['description']} |" for a in meta["arms"]],
        "",
        "Every widened starting model computes the base's function: the largest change of any logit on 16 held-out "
        "sequences was "
        + f"{max((r.get('start_max_logit_change', 0.0) for r in rows if r['runs']), default=0.0):.1e}.",
        "",
        f"**Verdict rule** (fixed before the run): arm B against arm A is *lower loss* if mean loss(A) − mean "
        f"loss(B) > {RULE_STDS:g} × the pooled standard deviation √((s_A² + s_B²)/2) over seeds, *higher loss* if it "
        f"is < −{RULE_STDS:g} × that, and *no measurable difference* otherwise.",
        "",
        "## Results",
        "",
        f"Held-out loss per next token (nats) and perplexity, mean ± std over seeds; the unigram reference "
        f"(training-set word frequencies, no context) on the same tokens is ppl {unigram:.1f} (loss "
        f"{math.log(unigram):.4f}), and *below unigram* is its loss minus the model's. FLOPs: training FLOPs of "
        f"the continuation ({meta['continuation_tokens']:,} tokens; `fixedhead.model.flops.training_flops`).",
        "",
        "| arm | d_p per layer | FFN | parameters | extra | continuation FLOPs (× as-is) | held-out loss | "
        "perplexity | below unigram | losses per seed | − as-is, same seed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if base:
        L.append(
            f"| base ({base_recipe['max_steps']} steps) | {base['head_dim']} | {model['intermediate_size']} | "
            f"{base['parameters']:,} | – | {base['flops']:.3g} (base training) | {base['heldout_loss']:.4f} | "
            f"{base['heldout_perplexity']:.1f} | {math.log(unigram) - base['heldout_loss']:.3f} | – | – |"
        )
    for r in rows:
        if not r["runs"]:
            L.append(f"| {r['arm']} | not run | | | | | | | | | |")
            continue
        L.append(
            f"| {r['arm']} | {r['layer_head_dims']} | {r['intermediate_size']} | {r['parameters']:,} | "
            f"{r['extra_parameters']:+,} | {r['flops']:.3g} ({r['flops_ratio']:.3f}) | "
            f"{_pm(r['loss_mean'], r['loss_std'])} | {_pm(r['ppl_mean'], r['ppl_std'], 1)} | "
            f"{r['below_unigram']:.3f} | {', '.join(f'{x:.4f}' for x in r['losses'])} | "
            f"{', '.join(f'{x:+.4f}' for x in r['paired_differences'])} |"
        )
    L += [
        "",
        "The last column is each seed's loss minus *as-is*'s with the same seed (the same batches): a "
        "description of the pairs, not part of the verdict rule, which compares the arms' means and spreads.",
        "",
        "## Verdicts",
        "",
        "| question | B vs A | mean(A) − mean(B), nats | threshold | verdict for B |",
        "|---|---|---|---|---|",
        *[
            f"| {c['question']} | {c['b']} vs {c['a']} | {c['difference']:+.4f} | {c['threshold']:.4f} | "
            f"**{c['verdict']}** |"
            for c in comps
        ],
        "",
    ]
    main = next((c for c in comps if c["b"] == "wide-all" and c["a"] == "as-is"), None)
    as_is = next((r for r in rows if r["arm"] == "as-is" and r["runs"]), None)
    if main and as_is and base:
        gain = base["heldout_loss"] - as_is["loss_mean"]
        L += [
            f"**In one sentence:** widening every layer's heads from d_p = "
            f"{model['hidden_size'] // model['num_attention_heads']} to {meta['wide_head_dim']} before "
            f"{cont['max_steps']} more steps gives "
            + {
                "lower loss": "a measurably lower held-out loss than continuing as is",
                "higher loss": "a measurably higher held-out loss than continuing as is",
                "no measurable difference": "no measurable difference in held-out loss from continuing as is",
            }.get(main["verdict"], "an undecided result against continuing as is (one seed)")
            + f" (as-is − wide-all = {main['difference']:+.4f} nats; threshold "
            f"{main['threshold']:.4f}); the continuation itself lowered the loss by {gain:.4f} nats from the base.",
            "",
        ]
    L += [
        "## What is and is not matched",
        "",
        "- Tokens and steps: every arm trains on the same number of tokens, in the same order for a given seed.",
        "- Parameters: *wide-early* and *wide-late* have exactly the same count; *ffn-matched* differs from "
        "*wide-all* by the few parameters a whole feed-forward unit cannot split (see the table); *as-is* has "
        "the fewest. There is no parameter-matched control for the one-layer arms.",
        "- FLOPs: the widened and ffn-matched arms cost more per token than *as-is*; the ratios are in the "
        "table. They count matrix products only, the output layer over the whole vocabulary included.",
        "",
    ]
    return "\n".join(L)
