"""What a pretraining run is trained with, defined once: the model size (:class:`ModelSettings`), the
optimisation (:class:`TrainSettings`) and the ``TrainingArguments`` pretraining and fine-tuning share.
Each field's default and attribute docstring are ``fixedhead pretrain``'s option and ``--help``."""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field

from ..checks import in_range, non_negative_int, positive_float, positive_int
from ..data.settings import OBJECTIVES, check_objective
from ..model.architectures import ARCHITECTURES
from ..model.parametrization import PARAMETRIZATIONS, QUERY_INITS

#: learning-rate schedules after the warm-up (transformers' ``SchedulerType`` names that need no
#: extra arguments): linear decay to 0 (BERT), cosine decay to 0, constant
LR_SCHEDULERS = ("linear", "cosine", "constant_with_warmup")


def report_to_integrations(names: list[str]) -> list[str]:
    """``report_to`` as the Trainer takes it: repeats dropped, ``none`` (or nothing) = ``[]``, ``all`` = every
    installed integration. Raises ValueError naming an unknown or uninstalled one, or ``none``/``all`` with others."""
    from transformers.integrations import integration_utils as iu

    names = list(dict.fromkeys(names))  # a repeated integration would log every scalar twice
    for word, meaning in (("none", "turns reporting off"), ("all", "already means every installed integration")):
        if word in names and len(names) > 1:
            others = " ".join(n for n in names if n != word)
            raise ValueError(
                f"report_to {' '.join(names)}: {word} {meaning}; pass {word} alone, or {others} without it"
            )
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return iu.get_available_reporting_integrations()
    for name in names:
        if name not in iu.INTEGRATION_TO_CALLBACK:
            raise ValueError(
                f"report_to {name}: unknown integration; known: none, all, {', '.join(iu.INTEGRATION_TO_CALLBACK)}"
            )
        available = getattr(iu, f"is_{name.replace('_ml', '').replace('azure', 'azureml')}_available", None)
        if available is not None and not available():
            raise ValueError(f"report_to {name}: the {name} package is not installed (pip install it, or pick another)")
    return names


@dataclass
class ModelSettings:
    """The size of a model trained from scratch: the paper's d, h and d_p (a paper preset or a run
    to continue brings its own), and its family."""

    architecture: str = field(default="fixedhead", metadata={"choices": ARCHITECTURES})
    """fixedhead: post-LN BERT-style (masked or causal); llama: transformers' LlamaForCausalLM
    (pre-norm, rotary, SwiGLU; causal only, one head size for every layer, no mup)"""
    hidden_size: int = 128
    """d, the embedding size"""
    num_hidden_layers: int = 2
    """layers"""
    num_attention_heads: int = 16
    """h, heads per layer"""
    head_dim: int | list | None = None
    """fixed head size d_p, or one per layer (64,64,128,128; none = d/h); omit for the standard d/h"""
    qk_head_dim: int | None = None
    """size of each head's queries and keys (the logits' rank bound, Theorem 1) in every layer; omit for d_p"""
    v_head_dim: int | None = None
    """size of each head's values in every layer; omit for d_p"""
    intermediate_size: int | None = None
    """feed-forward width (default 4d)"""
    dropout: float = 0.0
    """hidden and attention dropout"""
    parametrization: str = field(default="standard", metadata={"choices": PARAMETRIZATIONS})
    """how the logit scale and the output projection's init and learning rate follow d_p: standard
    (BERT, 1/sqrt(d_p)) or mup (1/d_p; needs --mup-base-head-dim)"""
    mup_base_head_dim: int | None = None
    """the d_p at which mup equals standard"""
    attention_scale: float | None = None
    """a logit scale overriding the parametrization's"""
    query_init: str = field(default="normal", metadata={"choices": QUERY_INITS})
    """normal, or zero: W_q starts at 0 (uniform attention at step 0)"""

    def config(self, max_position_embeddings: int):
        """The ``FixedHeadConfig`` (``LlamaConfig`` for ``architecture="llama"``) of this size for
        ``max_position_embeddings`` tokens; vocabulary and special tokens come later from the tokenizer
        (:func:`~fixedhead.training.pretrain.lm_config`). Raises ValueError naming a refused size or option."""
        from ..model.architectures import build_config

        in_range("dropout", self.dropout, 0.0, 1.0)  # the config would name its two fields
        if self.architecture == "llama" and self.dropout:
            raise ValueError(
                f"architecture 'llama' has attention dropout only, and --dropout sets hidden dropout too; "
                f"got dropout={self.dropout}"
            )
        fields = asdict(self)  # every field but dropout is a config field of the same name
        dropout = fields.pop("dropout")
        if self.intermediate_size is None:
            fields["intermediate_size"] = 4 * self.hidden_size
        fields.update(
            max_position_embeddings=max_position_embeddings,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        return build_config(fields)


@dataclass
class TrainSettings:
    """Optimisation settings (AdamW; linear warm-up then linear decay, as BERT).

    The learning rate's default, 2e-3, is the masked recipe's (``compare --preset cpu-mlm``, the
    cpu-mlm sweep); causal recipes of fixed head sizes train at 1e-3 (docs/experiments.md says why).
    """

    batch_size: int = 64
    """sequences per step (per process under torchrun / accelerate)"""
    max_steps: int = 600
    """optimizer steps"""
    learning_rate: float = 2e-3
    """peak learning rate"""
    warmup_ratio: float = 0.06
    """fraction of the steps spent warming up linearly from 0"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    adam_beta2: float = 0.98
    """AdamW beta2"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    seed: int = 0
    """seed of the initialisation, data order and masking"""
    logging_steps: int = 25
    """log the training loss every N steps"""
    eval_steps: int = 100
    """score the held-out set every N steps"""
    save_steps: int = 200
    """checkpoint every N steps"""
    save_total_limit: int = 2
    """checkpoints kept"""
    eval_seed: int = 1234
    """seed of the one fixed masking of the held-out set"""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trainer integrations (tensorboard, wandb, mlflow, ...; a repeated one counts once), all (every
    installed one) or none (no logging)"""
    progress: bool = True
    """progress bars and messages"""
    torch_compile: bool = False
    """compile the model with torch.compile"""
    bf16: bool = False
    """bf16 autocast (mixed precision; weights and optimizer stay fp32); meant for GPUs with bf16,
    works on CPUs with it too"""
    gradient_checkpointing: bool = False
    """recompute each encoder block in the backward pass: less activation memory for about one more
    forward pass of time; same gradients (dropout masks are replayed)"""
    objective: str = field(default="mlm", metadata={"choices": OBJECTIVES})
    """mlm: masked LM (BERT, the paper's Tables 1-3); clm: causal (left-to-right) LM, FixedHeadForCausalLM"""
    mlm_probability: float = 0.15
    """masked LM: fraction of training tokens masked (BERT's; Wettig et al., EACL 2023, find 0.4
    better); the held-out set is always masked at 0.15, so every model is scored alike"""
    lr_scheduler_type: str = field(default="linear", metadata={"choices": LR_SCHEDULERS})
    """learning-rate schedule after the warm-up (linear decay to 0, as BERT)"""

    def training_arguments(self, output_dir: str | os.PathLike):
        """The ``transformers.TrainingArguments`` of a pretraining run in ``output_dir``."""
        return shared_training_arguments(
            output_dir,
            self,
            eval_batch_size=max(self.batch_size, 128),
            adam_beta2=self.adam_beta2,
            lr_scheduler_type=self.lr_scheduler_type,
            max_grad_norm=self.max_grad_norm,
            logging_steps=self.logging_steps,
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            prediction_loss_only=True,
            report_to=self.report_to,
            remove_unused_columns=False,
            ddp_find_unused_parameters=False,  # every parameter of the language model gets a gradient
            torch_compile=self.torch_compile,
            bf16=self.bf16,
        )

    def __post_init__(self):
        check_objective(self.objective)
        for name in ("batch_size", "max_steps", "logging_steps", "eval_steps", "save_steps", "save_total_limit"):
            positive_int(name, getattr(self, name))
        non_negative_int("seed", self.seed)
        non_negative_int("eval_seed", self.eval_seed)
        positive_float("learning_rate", self.learning_rate)
        in_range("warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        in_range("weight_decay", self.weight_decay, 0.0, 1.0, high_open=False)
        in_range("adam_beta2", self.adam_beta2, 0.0, 1.0)
        positive_float("max_grad_norm", self.max_grad_norm)
        in_range("mlm_probability", self.mlm_probability, 0.0, 1.0, low_open=True)
        if self.objective == "clm" and self.mlm_probability != 0.15:
            raise ValueError(
                f"mlm_probability={self.mlm_probability} applies to the masked objective only; "
                f"a causal LM predicts every token (drop the masking rate, or train a masked LM)"
            )
        if self.lr_scheduler_type not in LR_SCHEDULERS:
            raise ValueError(
                f"lr_scheduler_type must be one of {', '.join(LR_SCHEDULERS)}, got {self.lr_scheduler_type!r}"
            )
        self.report_to = report_to_integrations(self.report_to)


def shared_training_arguments(output_dir: str | os.PathLike, settings, eval_batch_size: int, **own):
    """``TrainingArguments`` for ``settings`` (AdamW, linear warm-up then decay unless ``own`` says otherwise),
    with the caller's ``own`` fields added or overriding. ``warmup_steps`` gets the warm-up ratio: transformers 5
    reads a value below 1 as a fraction of ``max_steps``."""
    import torch  # here, not above: the command line reads this module's settings without torch
    from transformers import TrainingArguments

    fields = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=eval_batch_size,
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_ratio,  # < 1: a fraction of max_steps (see the docstring)
        lr_scheduler_type="linear",
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        eval_strategy="steps",
        eval_steps=settings.eval_steps,
        save_strategy="steps",
        disable_tqdm=not settings.progress,
        dataloader_num_workers=0,
        activation_checkpointing=settings.gradient_checkpointing,
        use_cpu=not torch.cuda.is_available(),
    )
    return TrainingArguments(**{**fields, **own})


@contextlib.contextmanager
def transformers_progress_bars(enabled: bool):
    """transformers' own progress bars on or off inside the block, as a run's ``progress`` says; restored after."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


@contextlib.contextmanager
def transformers_verbosity(level: int | None):
    """transformers' logging at ``level`` (``logging.ERROR``: its load reports and warnings hidden) inside the
    block, the earlier level restored after, whether the block returns or raises; None leaves it as it is."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    if level is not None:
        hf_logging.set_verbosity(level)
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def quiet_unless(progress: bool, trainer):
    """With ``progress`` off, the Trainer prints nothing per step: ``disable_tqdm`` swaps its bar for
    ``PrinterCallback``, which prints every log dict (``{'loss': ...}``), so that callback goes too. Returns
    ``trainer``."""
    from transformers.trainer_callback import PrinterCallback

    if not progress:
        trainer.remove_callback(PrinterCallback)
    return trainer
