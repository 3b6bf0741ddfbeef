"""`fixedhead compare`: standard vs fixed head size, trained and scored on the same real text.

The default preset ``cpu`` is CPU-sized (the README's ``make run``): three causal (left-to-right)
language models on the same tokenizer, data and step budget, at n = 64 tokens —

* ``standard``: hidden d=128 with h=16 heads, so d_p = d/h = 8, far below n (the paper's
  bottleneck regime, Section 3);
* ``fixed``: the same d and h with a fixed head size d_p = 32, the paper's fix (Section 4) at the
  threshold of a causal head, ⌈(n − 1)/2⌉ = 32 (:func:`fixedhead.theory.min_head_dim` with
  ``causal=True``: a causal head's logits are free above the diagonal, so generic causal
  attention needs about half the rank of bidirectional attention);
* ``standard-wide``: a standard model whose hidden size is chosen to match the fixed model's
  parameter count (the paper's Fig. 1/2 question: is the fixed model better than simply making
  the standard one bigger?).

``cpu-mlm`` is the same question for masked LMs (n = 32, fixed d_p = n, the masked-LM recipe of
``benchmarks/bench_tokens_to_quality.py``); ``cpu-llama`` the ``cpu`` question for Llama-style
decoders (transformers' ``LlamaForCausalLM``: pre-norm, rotary, SwiGLU), and ``architecture="llama"``
(``--architecture llama``) asks it of any preset's models; ``tiny`` a seconds-long smoke test. A causal LM is
used by default because on a CPU budget it is the objective that leaves the word-frequency plateau
(docs/performance.md, "Tokens to quality").
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...data import DataSettings, prepare_data
from ...data.lm import unigram_perplexity
from ...model.architectures import (
    build_config,
    check_architecture,
    check_objective_for,
    head_size_label,
    is_fixed_head,
)
from ...model.sizes import parameter_count
from ...runs import claim_output_dir, environment_info, invocation_commands, staged_outputs, write_json_atomic
from ...theory import causal_threshold
from ...training.pretrain import train_or_reuse
from ...training.settings import TrainSettings
from ..kit import core, render
from ..kit.learning_rate import (
    RULE,
    choose_on_validation,
    parse_rates,
    plot_learning_rates,
    selection_record,
    with_validation_split,
)
from ..kit.recipes import get_recipe


@dataclass
class ComparePreset:
    """Data and training settings shared by all models, and each model's config fields."""

    description: str
    data: DataSettings
    train: TrainSettings
    models: dict[str, dict] = field(default_factory=dict)
    #: name of a standard model to widen until it matches ``match_to``'s parameter count
    widen: str | None = None
    match_to: str | None = None
    #: each model's own learning rate (chosen on a validation split by ``--learning-rates``); a
    #: model not named trains at the recipe's
    learning_rates: dict[str, float] = field(default_factory=dict)


def _preset(
    recipe: str,
    d: int,
    h: int,
    fixed_head_dim: int,
    why: str,
    mup: bool = False,
    architecture: str = "fixedhead",
    rates: dict | None = None,
) -> ComparePreset:
    """Three models of one recipe: standard d_p = d/h, fixed d_p, and a standard model widened to
    the fixed one's parameter count; with ``mup``, all three under the μP-style parametrization
    (:mod:`fixedhead.model.parametrization`) based at the standard model (d_p = d/h, h heads), where
    it is the standard parametrization; ``architecture``: see :mod:`fixedhead.model.architectures`.
    ``rates``: each model's own learning rate, chosen by ``--learning-rates`` on the validation
    split, which the models then train without too (so each trains exactly as when its rate was chosen)."""
    r = get_recipe(recipe)
    extra = dict(parametrization="mup", mup_base_head_dim=d // h, mup_base_num_attention_heads=h) if mup else {}
    if architecture != "fixedhead":
        extra["architecture"] = architecture
    recipe_text = r.describe().rsplit(" at lr ", 1)[0]  # the rate is named by run_compare (shared, own, grid)
    return ComparePreset(
        description=f"{recipe_text}: d={d}, {h} heads, standard d_p={d // h} vs fixed d_p={fixed_head_dim} ({why}) "
        f"vs a parameter-matched wider standard model"
        f"{f', all μP-style (base d_p={d // h}, {h} heads)' if mup else ''}{_as(architecture)}; "
        f"{Path(r.data.corpus).name}",
        data=with_validation_split(r.data) if rates else r.data,
        train=r.train,
        learning_rates=dict(rates or {}),
        models={
            name: r.model_fields(hidden_size=d, num_attention_heads=h, head_dim=head_dim, **extra)
            for name, head_dim in (("standard", None), ("fixed", fixed_head_dim), ("standard-wide", None))
        },
        widen="standard-wide",
        match_to="fixed",
    )


def _as(architecture: str) -> str:
    return "" if architecture == "fixedhead" else ", as Llama-style decoders (transformers' LlamaForCausalLM)"


def _cpu_clm(why: str = "the causal threshold ceil((n-1)/2)", **kw) -> ComparePreset:
    """The ``cpu-clm`` recipe's models at n = 64: d=128, h=16, fixed d_p at the causal threshold."""
    return _preset("cpu-clm", 128, 16, causal_threshold(64), why, **kw)


COMPARE_PRESETS = {
    # each model's rate: `fixedhead compare --learning-rates 5e-4,1e-3,2e-3,4e-3` (docs/results/make-run-lr)
    "cpu": lambda: _cpu_clm(rates={"standard": 2e-3, "fixed": 2e-3, "standard-wide": 2e-3}),
    "cpu-llama": lambda: _cpu_clm(architecture="llama"),
    # standard: μP based at it is the standard parametrization (make-run-lr's 2e-3); fixed: docs/results/mup
    "cpu-mup": lambda: _cpu_clm(
        "the causal threshold", mup=True, rates={"standard": 2e-3, "fixed": 2e-3, "standard-wide": 1e-3}
    ),
    "cpu-mlm": lambda: _preset("cpu-mlm", 128, 16, 32, "= n"),
    "tiny": lambda: _preset("tiny", 32, 8, 16, "a smoke test"),
}


OUTPUT_FILES = ("results.json", "results.csv", "learning_curves.png", "learning_rates.png")


def get_compare_preset(name: str) -> ComparePreset:
    """Raises ValueError listing the known preset names."""
    return core.pick(COMPARE_PRESETS, name, "compare")


def widened_ffn(base: dict, d: int) -> int:
    """The feed-forward width of ``base`` widened to hidden size ``d``: the base's ratio f/d kept (4 when unset)."""
    ratio = (base.get("intermediate_size") or 4 * base["hidden_size"]) / base["hidden_size"]
    return round(ratio * d)


def match_hidden_size(base: dict, target_params: int, vocab_size: int, step: int | None = None) -> int:
    """Smallest standard hidden size (a multiple of the head count, FFN at the base's ratio f/d) whose parameter
    count reaches ``target_params`` (:func:`~fixedhead.model.sizes.parameter_count` of the
    fields' architecture: fixedhead's without pooler, as the MLM model has none). A Llama model's
    d/h stays even (a multiple of 2h): rotary positions rotate pairs of coordinates."""
    heads = base["num_attention_heads"]
    step = step or heads * (2 if base.get("architecture") == "llama" else 1)
    d = base["hidden_size"]
    while True:
        cfg = build_config(
            {**base, "hidden_size": d, "intermediate_size": widened_ffn(base, d), "vocab_size": vocab_size}
        )
        if parameter_count(cfg) >= target_params or d > 64 * base["hidden_size"]:
            return d
        d += step


def run_compare(
    preset: str | ComparePreset = "cpu",
    output_dir: str | Path = "runs/compare",
    corpus: str | None = None,
    max_steps: int | None = None,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    overwrite: bool = False,
    cache_dir=None,
    progress: bool = True,
    command: str | None = None,
    objective: str | None = None,
    learning_rates: list[float] | None = None,
    max_extensions: int = 3,
    architecture: str | None = None,
    models: list[str] | None = None,
) -> list[dict]:
    """Train and score every model of a compare preset; write results.json/.csv and learning_curves.png.

    Models whose run directory already holds finished metrics with the same settings are not
    retrained (an interrupted compare resumes where it stopped).

    ``learning_rates``: a grid (at least 2 rates, e.g. :func:`~fixedhead.studies.kit.learning_rate.rate_grid`)
    over which each model chooses its own rate on a validation split of the training documents
    (:mod:`fixedhead.studies.kit.learning_rate`: extended past an edge up to ``max_extensions`` times);
    every run goes to ``OUTPUT_DIR/lr-grid/MODEL-lrRATE``, the chosen one is each model's result,
    and ``learning_rates.png`` shows validation loss against rate per model. ``models``: train only
    these of the preset's models (the widened one is still sized against its reference).

    ``architecture``: train every model of the preset as this family
    (:mod:`fixedhead.model.architectures`: ``"llama"`` for transformers' ``LlamaForCausalLM`` with the
    same d, h, d_p, feed-forward width and depth; causal only); default: each model's own.
    ``command``: the command line results.json records (default: this process's arguments).

    Returns:
        one result dict per model (see :func:`fixedhead.training.pretrain`), in preset order.

    Raises:
        FileNotFoundError: the corpus is missing (the message says how to pass another).
        FileExistsError: ``output_dir`` holds runs with other settings (without ``overwrite``).
        ValueError: a model the architecture cannot build or train (a μP-style or masked Llama model).
    """
    p = get_compare_preset(preset) if isinstance(preset, str) else preset
    unknown = sorted(set(models or ()) - set(p.models))
    if unknown:
        raise ValueError(f"no model {', '.join(map(repr, unknown))} in this preset: it has {', '.join(p.models)}")
    data_settings = replace(p.data, corpus=corpus) if corpus else p.data
    if learning_rates is not None:
        if learning_rate is not None:
            raise ValueError(
                f"learning_rate {learning_rate!r} and a learning-rate grid were both given: the grid chooses each "
                "model's rate; pass one of them"
            )
        learning_rates = parse_rates(learning_rates)
        data_settings = with_validation_split(data_settings)  # rates are chosen on text no model trains on
    overrides = dict(max_steps=max_steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate)
    train = replace(p.train, **{k: v for k, v in overrides.items() if v is not None})  # validated by TrainSettings
    description = p.description
    if (train.max_steps, train.batch_size) != (p.train.max_steps, p.train.batch_size):  # the text names the preset's
        description += f" (here {train.max_steps} steps of batch {train.batch_size}, overriding the preset's)"
    if objective is not None and objective != train.objective:  # the masking rate is the masked objective's
        description += f" (trained as {objective} instead of the preset's {train.objective}: same sizes and recipe)"
        train = replace(train, objective=objective, mlm_probability=0.15)
    train = replace(train, progress=progress)
    if learning_rates is not None:
        grid = ", ".join(f"{x:g}" for x in learning_rates)
        description += f"; each model at the best rate of the grid {grid} on a validation split"
    elif learning_rate is None and p.learning_rates:
        own = ", ".join(f"{name} {lr:g}" for name, lr in p.learning_rates.items())
        description += f"; each model at its own learning rate ({own}), chosen on a validation split"
    else:
        description += f"; learning rate {train.learning_rate:g}"
    configs = {name: dict(fields) for name, fields in p.models.items()}
    if architecture is not None and any(f.get("architecture", "fixedhead") != architecture for f in configs.values()):
        description += _as(check_architecture(architecture))
        for fields in configs.values():
            fields["architecture"] = architecture
    for fields in configs.values():  # every model buildable and trainable before any slow work
        check_objective_for(build_config({**fields, "vocab_size": data_settings.vocab_size}), train.objective)
    out = Path(output_dir)
    owned = (*p.models, *OUTPUT_FILES, "lr-grid", ".results.*", ".learning_curves.png.*", ".learning_rates.png.*")
    claim_output_dir(out, ("results.json", *p.models), owned, "compare", create=False, results_file="results.json")
    t_start = time.time()
    data = prepare_data(data_settings, cache_dir=cache_dir, progress=progress)
    out.mkdir(parents=True, exist_ok=True)  # only once the data is good: a bad corpus leaves nothing behind
    vocab = len(data.tokenizer)

    if p.widen and p.match_to:
        target = parameter_count(build_config({**configs[p.match_to], "vocab_size": vocab}))
        d = match_hidden_size(configs[p.widen], target, vocab)
        configs[p.widen].update(hidden_size=d, intermediate_size=widened_ffn(configs[p.widen], d))
    if models:
        configs = {name: fields for name, fields in configs.items() if name in models}
    own = p.learning_rates if learning_rate is None else {}  # without a grid: a given rate, else each model's own
    rate_of = {name: own.get(name, train.learning_rate) for name in configs}

    meta = {
        "study": "compare",
        "command": invocation_commands(command, {})[0],
        "preset": preset if isinstance(preset, str) else "custom",
        "objective": train.objective,
        # the context-free reference on the same held-out tokens: how far below it the models are is
        # how much they learnt beyond word frequencies (see unigram_perplexity)
        "unigram_perplexity": unigram_perplexity(data, train.eval_seed, train.objective),
        "description": description,
        "data": data_settings.record(),
        "data_info": data.info,
        "train": asdict(train),
        # decided before any training: the models, each one's rate or the grid it chooses from, the rule
        "plan": {
            "models": configs,
            "seed": train.seed,
            **(
                {"grid": learning_rates, "max_extensions": max_extensions, "rule": RULE}
                if learning_rates is not None
                else {"learning_rates": rate_of}
            ),
        },
    }
    if not (out / "results.json").is_file():  # a finished comparison's results stay until replaced
        write_json_atomic(out / "results.json", {"meta": meta, "results": []})
    results, run_dirs, selection = [], {}, {}
    for i, (name, fields) in enumerate(configs.items(), 1):
        config = build_config({**fields, "vocab_size": vocab, "pad_token_id": data.tokenizer.pad_token_id})
        if progress:
            print(
                f"\n[{i}/{len(configs)}] {name} ({config.model_type}): d={config.hidden_size}, "
                f"h={config.num_attention_heads}, d_p={head_size_label(config)} "
                f"({'fixed' if is_fixed_head(config) else 'standard'}), "
                f"{parameter_count(config):,} parameters, {train.max_steps} steps",
                flush=True,
            )
        if learning_rates is None:
            lr = rate_of[name]
            run_dirs[name] = out / name
            result = train_or_reuse(config, data, run_dirs[name], replace(train, learning_rate=lr), overwrite)
            results.append({**result, "name": name, **({"learning_rate": lr} if p.learning_rates else {})})
            continue
        runs = {}

        def train_at(lr, name=name, config=config, runs=runs):
            run_dir = out / "lr-grid" / core.run_key(name, lr)
            if progress:
                print(f"{name} at lr {lr:g} ({run_dir})", flush=True)
            runs[lr] = train_or_reuse(config, data, run_dir, replace(train, learning_rate=lr), overwrite)
            return runs[lr]

        choice = choose_on_validation(train_at, learning_rates, max_extensions)
        best = choice["chosen"]
        run_dirs[name] = out / "lr-grid" / core.run_key(name, best)
        results.append({**runs[best], "name": name, "learning_rate": best})
        selection[name] = {**choice, "heldout_loss": {f"{lr:g}": runs[lr]["heldout_loss"] for lr in sorted(runs)}}
        if progress:
            edge = "" if choice["bracketed"] else " (at an edge of the grid)"
            print(f"{name}: lr {best:g} chosen on the validation split{edge}")
    if train.objective == "clm":  # what a causal model says: the sensible-output check of the README
        for r in results:
            r["samples"] = continuations(run_dirs[r["name"]], seed=train.seed)
    if selection:
        meta["learning_rate_selection"] = selection_record(
            learning_rates, max_extensions, train.seed, data_settings.validation_fraction, models=selection
        )
    meta.update(total_seconds=round(time.time() - t_start, 1), **environment_info())
    write_results(results, out, meta)
    print()  # the results, with or without progress bars
    print(format_table(results, meta["unigram_perplexity"]))
    for r in results:
        for prompt, text in r.get("samples", {}).items():
            print(f"{r['name']:>14}: {prompt} | {text}")
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'learning_curves.png'}")
    return results


#: prompts continued by every causal model of a comparison (public-domain style, not from the books)
SAMPLE_PROMPTS = ("it was a dark and stormy night, and", "the king said to his son that")


def continuations(run_dir, prompts=SAMPLE_PROMPTS, max_new_tokens: int = 24, seed: int = 0) -> dict[str, str]:
    """Sampled continuations of ``prompts`` by a causal run, through transformers'
    ``pipeline("text-generation")`` (top-k 40, temperature 0.8, seeded; only the new text):
    ``{prompt: continuation}``. A continuation stops where the model's learned positions end
    (``max_position_embeddings``).

    Raises:
        ValueError: a prompt that already fills the learned positions.
    """
    from transformers import pipeline, set_seed

    generate = pipeline("text-generation", model=str(run_dir), device="cpu")
    room = generate.model.config.max_position_embeddings
    samples = {}
    for prompt in prompts:
        set_seed(seed)
        length = len(generate.tokenizer(prompt)["input_ids"])
        if length >= room:
            raise ValueError(f"prompt {prompt[:40]!r} is {length} tokens, no room left in n = {room} positions")
        # max_length (the generation config's own field) rather than max_new_tokens: no warning about both
        out = generate(
            prompt,
            max_length=min(room, length + max_new_tokens),
            do_sample=True,
            top_k=40,
            temperature=0.8,
            return_full_text=False,
        )
        samples[prompt] = " ".join(out[0]["generated_text"].split())
    return samples


TABLE_COLUMNS = [
    ("name", "model", "{}"),
    ("hidden_size", "d", "{}"),
    ("num_attention_heads", "h", "{}"),
    ("head_dim", "d_p", "{}"),
    ("parameters", "params", "{:,}"),
    ("training_tokens", "train tokens", "{:,}"),
    ("heldout_perplexity", "held-out ppl", "{:.2f}"),
    # bits per character: tokenizer-independent (None or absent in results from before it was measured)
    ("heldout_bits_per_character", "bits/char", "{:.3f}"),
    ("heldout_accuracy", "top-1 acc", "{:.4f}"),
    ("train_seconds", "wall s", "{:.0f}"),
]


#: columns an older results file may lack: shown as a dash in the table, left empty in results.csv
OPTIONAL_COLUMNS = ("heldout_bits_per_character",)


def _columns(results: list[dict]) -> list[tuple[str, str, str]]:
    """The table's columns; a learning-rate column where models trained at their own rates."""
    columns = list(TABLE_COLUMNS)
    if any("learning_rate" in r for r in results):
        columns.insert(columns.index(("training_tokens", "train tokens", "{:,}")), ("learning_rate", "lr", "{:g}"))
    return columns


def _cell(r: dict, key: str, fmt: str) -> str:
    value = r.get(key) if key in OPTIONAL_COLUMNS else r[key]
    return "-" if value is None else fmt.format(value)


def format_table(results: list[dict], unigram_perplexity: float | None = None) -> str:
    """A plain-text table of the comparison (one row per model); with the unigram reference, a column
    of how far below it each model's held-out loss is (nats) and a closing line naming it."""
    columns = _columns(results)
    results = [dict(r) for r in results]
    if unigram_perplexity:
        columns.insert(-1, ("below_unigram", "below unigram", "{:.2f}"))
        for r in results:
            r["below_unigram"] = math.log(unigram_perplexity) - r["heldout_loss"]
    rows = [[_cell(r, key, fmt) for key, _, fmt in columns] for r in results]
    headers = [h for _, h, _ in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    lines = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    if unigram_perplexity:
        objective = results[0].get("objective", "mlm") if results else "mlm"
        scored = "masked tokens" if objective == "mlm" else "next tokens"
        lines.append(
            f"unigram reference (training-set word frequencies, no context) on the same held-out {scored}: "
            f"ppl {unigram_perplexity:.1f}; 'below unigram' is its log minus the model's loss, in nats"
        )
    return "\n".join(lines)


def write_results(results: list[dict], out: Path, meta: dict) -> None:
    """results.json (everything, curves included), results.csv (the table) and learning_curves.png,
    written together or not at all (see :func:`fixedhead.runs.staged_outputs`)."""
    with staged_outputs(out) as stage:
        stage("results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        keys = [k for k, _, _ in _columns(results)] + ["heldout_loss", "fixed_head", "num_hidden_layers"]
        render.write_csv(stage("results.csv"), keys, results)
        render.plot_learning_curves(results, stage("learning_curves.png"), meta.get("description", ""))
        if "learning_rate_selection" in meta:
            plot_learning_rates(meta["learning_rate_selection"], stage("learning_rates.png"))
