"""Training recipes: named data and training settings, the one home of every number a language-model
study trains with and of the tests' tiny runs. ``cpu-clm`` (``make run``) trains causal LMs because on a CPU
budget a causal LM leaves the word-frequency plateau where a masked LM does not (docs/performance.md);
``cpu-mlm`` is the masked-LM recipe of ``benchmarks/bench_tokens_to_quality.py``; ``tiny`` is seconds long.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...data import DEFAULT_CORPUS, DataSettings
from ...training.settings import TrainSettings
from . import core


@dataclass(frozen=True)
class Recipe:
    """Data settings, training settings and the model fields every model of a study shares."""

    name: str
    data: DataSettings
    train: TrainSettings
    layers: int = 2
    shared_model: dict = field(default_factory=dict)

    def model_fields(self, **fields) -> dict:
        """:class:`~fixedhead.model.configuration.FixedHeadConfig` fields: the shared ones, then ``fields``."""
        shared = dict(
            num_hidden_layers=self.layers,
            max_position_embeddings=self.data.max_seq_length,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return {**shared, **self.shared_model, **fields}

    def describe(self, rate: bool = True) -> str:
        """``"causal LMs, 2 layers, n=64, vocabulary 8192, 700 steps of 32x64 tokens at lr 0.001"``."""
        text = training_text(self.data, self.train, self.layers)
        return text + (f" at lr {self.train.learning_rate:g}" if rate else "")


def objective_text(train) -> str:
    """What a run's objective makes of it: ``"causal LMs"``, ``"masked LMs (40% of training tokens masked)"``."""
    what = "causal LMs" if train.objective == "clm" else "masked LMs"
    if train.objective == "mlm" and train.mlm_probability != 0.15:
        what += f" ({100 * train.mlm_probability:g}% of training tokens masked)"
    return what


def training_text(data, train, layers: int) -> str:
    """What a run trains, from its settings: ``"causal LMs, 2 layers, n=64, vocabulary 8192, 700 steps of
    32x64 tokens"``."""
    return (
        f"{objective_text(train)}, {layers} layer{'s' if layers > 1 else ''}, n={data.max_seq_length}, vocabulary "
        f"{data.vocab_size}, {train.max_steps} steps of {train.batch_size}x{data.max_seq_length} tokens"
    )


def with_steps(train: TrainSettings, steps: int, evaluations: int, checkpoints: int) -> TrainSettings:
    """``train`` for ``steps`` steps with ``evaluations`` evaluations and ``checkpoints`` checkpoints evenly
    spaced (every ``steps // k`` steps; ``k = 0``: none inside the run): every study's one rule."""

    def every(k: int) -> int:
        return steps + 1 if k == 0 else max(1, steps // k)

    return replace(train, max_steps=steps, eval_steps=every(evaluations), save_steps=every(checkpoints))


def _cpu(name: str, n: int, steps: int, evaluations: int, max_eval_tokens: int, **train) -> Recipe:
    """A CPU recipe; an interrupted run resumes from its halfway checkpoint."""
    return Recipe(
        name=name,
        data=DataSettings(
            corpus=str(DEFAULT_CORPUS), vocab_size=8192, max_seq_length=n, max_eval_tokens=max_eval_tokens
        ),
        train=with_steps(TrainSettings(batch_size=32, **train), steps, evaluations, checkpoints=2),
        shared_model=dict(intermediate_size=512),
    )


def _cpu_clm() -> Recipe:
    # 100k held-out tokens: a causal model scores every one with the full output layer. The shared
    # rate 1e-3 suits the fixed model (flat from 1e-3 to 2e-3) more than the standard ones, which
    # do best at 2e-3 (docs/results/make-run-lr): make run's preset sets each model's own rate
    return _cpu("cpu-clm", 64, 700, 4, 100_000, objective="clm", learning_rate=1e-3)


def _cpu_mlm() -> Recipe:
    return _cpu("cpu-mlm", 32, 2800, 7, 200_000, learning_rate=2e-3, mlm_probability=0.4)


def _tiny() -> Recipe:
    return Recipe(
        name="tiny",
        data=DataSettings(
            corpus=str(DEFAULT_CORPUS),
            vocab_size=400,
            max_seq_length=32,
            heldout_fraction=0.1,  # a slice of text has few documents: hold out enough of them
            max_train_tokens=40_000,
            max_eval_tokens=4_000,
            tokenizer_max_chars=300_000,
        ),
        train=TrainSettings(
            batch_size=16,
            max_steps=20,
            learning_rate=3e-3,
            logging_steps=5,
            eval_steps=10,
            save_steps=5,
            report_to=[],
        ),
        layers=1,
        shared_model=dict(intermediate_size=64),
    )


def _gpu_clm() -> Recipe:
    # one GPU's causal recipe: n = 128, batch 64, bf16, 4 layers (the scaling study's gpu preset)
    return Recipe(
        name="gpu-clm",
        data=DataSettings(corpus=str(DEFAULT_CORPUS), vocab_size=8192, max_seq_length=128, max_eval_tokens=200_000),
        train=TrainSettings(
            batch_size=64,
            max_steps=1000,
            eval_steps=250,
            save_steps=500,
            objective="clm",
            learning_rate=1e-3,
            bf16=True,
        ),
        layers=4,
        shared_model=dict(intermediate_size=512),
    )


RECIPES = {"cpu-clm": _cpu_clm, "cpu-mlm": _cpu_mlm, "gpu-clm": _gpu_clm, "tiny": _tiny}


def get_recipe(name: str) -> Recipe:
    """A fresh :class:`Recipe` (its settings may be changed freely). Raises ValueError listing the names."""

    return core.pick(RECIPES, name, "recipe")
