"""The two model families a study can train, built from one set of field names.

* ``fixedhead``: this library's post-LN BERT-style model (:class:`~fixedhead.model.configuration.FixedHeadConfig`;
  masked or causal, learned positions, GELU feed-forward, every option of the head size);
* ``llama``: transformers' own ``LlamaForCausalLM`` (a pre-norm decoder with RMSNorm, rotary
  positions and a SwiGLU feed-forward), whose ``LlamaConfig(head_dim=...)`` sets the head size d_p
  apart from d/h as the paper asks. Nothing of it is re-implemented here.

A study describes a model by ``FixedHeadConfig`` fields plus an ``architecture`` key;
:func:`build_config` turns them into either config, and the helpers below answer what a report
needs (objective, head size, parameter count) for both.
"""

from __future__ import annotations

#: the model families, in the order the CLI lists them
ARCHITECTURES = ("fixedhead", "llama")

#: FixedHeadConfig fields that only fixedhead's attention layer has, with the value that means "off"
FIXEDHEAD_ONLY = {
    "parametrization": "standard",
    "mup_base_head_dim": None,
    "mup_base_num_attention_heads": None,
    "attention_scale": None,
    "query_init": "normal",
}

#: FixedHeadConfig field → LlamaConfig field, for the fields both have under another name
_RENAMED = {"attention_probs_dropout_prob": "attention_dropout", "layer_norm_eps": "rms_norm_eps"}

#: fields passed to LlamaConfig as they are
_SHARED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "initializer_range",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "use_cache",
)


def check_architecture(architecture: str) -> str:
    """``architecture`` itself. Raises ValueError naming it when it is not one of :data:`ARCHITECTURES`."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    return architecture


def llama_config(**fields):
    """A ``transformers.LlamaConfig`` from ``FixedHeadConfig`` field names.

    ``head_dim``: None for d/h, an int for a fixed head size (logits scaled by 1/√d_p). Plain multi-head
    attention unless ``num_key_value_heads`` is given; ``intermediate_size`` defaults to 4d (SwiGLU's three d×f
    matrices give a Llama layer d·f more weights than GELU's two); embeddings tied unless ``tie_word_embeddings``
    says otherwise; ``attention_probs_dropout_prob`` → ``attention_dropout``, ``layer_norm_eps`` →
    ``rms_norm_eps``; ``is_decoder`` and ``type_vocab_size`` are dropped.

    Raises:
        ValueError: naming the value: per-layer head sizes, ``qk_head_dim`` or ``v_head_dim`` (Llama has one head
            size), a fixedhead-only option (:data:`FIXEDHEAD_ONLY`) away from its default, hidden dropout, a field
            Llama lacks, or a size ``LlamaConfig`` refuses (an odd head size: rotary positions rotate pairs).
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import LlamaConfig

    fields = dict(fields)
    head_dim = fields.pop("head_dim", None)
    if isinstance(head_dim, (list, tuple)):
        raise ValueError(
            f"architecture 'llama' takes one head size for every layer; got per-layer head_dim={list(head_dim)!r}"
        )
    for name in ("qk_head_dim", "v_head_dim"):
        value = fields.pop(name, None)
        if value is not None:
            raise ValueError(
                f"{name}={value!r}: architecture 'llama' (transformers' LlamaForCausalLM) has one head size for "
                f"queries, keys and values; set head_dim, or train architecture 'fixedhead' for separate sizes"
            )
    for name, off in FIXEDHEAD_ONLY.items():
        value = fields.pop(name, off)
        if value != off:
            raise ValueError(
                f"{name}={value!r} is an option of fixedhead's attention only; architecture 'llama' has none"
            )
    hidden_dropout = fields.pop("hidden_dropout_prob", 0.0)
    if hidden_dropout:
        raise ValueError(
            f"architecture 'llama' has attention dropout only (no hidden dropout); "
            f"got hidden_dropout_prob={hidden_dropout}"
        )
    fields.pop("is_decoder", None)
    fields.pop("type_vocab_size", None)
    kwargs = {_RENAMED.get(k, k): v for k, v in fields.items()}
    unknown = sorted(k for k in kwargs if k not in _SHARED and k not in _RENAMED.values())
    if unknown:
        raise ValueError(f"architecture 'llama' has no field {unknown[0]!r} (of {', '.join(unknown)})")
    if kwargs.get("intermediate_size") is None and isinstance(kwargs.get("hidden_size"), int):
        kwargs["intermediate_size"] = 4 * kwargs["hidden_size"]
    kwargs.setdefault("tie_word_embeddings", True)
    try:
        return LlamaConfig(head_dim=head_dim, **kwargs)
    except (TypeError, ValueError, StrictDataclassError) as e:  # transformers' strict validation, e.g. an odd
        # rotary head size: say which config refused and why
        raise ValueError(
            f"LlamaConfig refuses {kwargs | {'head_dim': head_dim}}: {getattr(e, '__cause__', None) or e}"
        ) from None


def build_config(fields: dict):
    """The config of a model described by ``FixedHeadConfig`` fields and an optional
    ``architecture`` key (default ``"fixedhead"``): a :class:`FixedHeadConfig` or, for
    ``"llama"``, :func:`llama_config`.

    Raises:
        ValueError: an unknown architecture, or fields the config refuses (naming them).
    """
    from .configuration import FixedHeadConfig  # here: the command line reads ARCHITECTURES without transformers

    fields = dict(fields)
    architecture = check_architecture(fields.pop("architecture", "fixedhead"))
    return llama_config(**fields) if architecture == "llama" else FixedHeadConfig(**fields)


def objective_of(config) -> str:
    """``"clm"`` for a causal language model's config (a fixedhead decoder, any Llama), else ``"mlm"``."""
    return "clm" if config.model_type == "llama" or getattr(config, "is_decoder", False) else "mlm"


def check_objective_for(config, objective: str) -> None:
    """Refuse an objective the config's architecture cannot train (a Llama model is causal only:
    transformers has no Llama masked LM).

    Raises:
        ValueError: naming the architecture and the objective.
    """
    if config.model_type == "llama" and objective != "clm":
        raise ValueError(
            f"architecture 'llama' trains causal LMs only; got objective {objective!r}: "
            "choose a causal preset or objective"
        )


def head_size_label(config) -> int | list[int]:
    """d_p for reports: the int, or fixedhead's per-layer list where layers differ."""
    from .configuration import FixedHeadConfig

    return config.head_size_label if isinstance(config, FixedHeadConfig) else config.head_dim


def is_fixed_head(config) -> bool:
    """Whether the head size is set apart from d/h: fixedhead's explicit ``head_dim``; for Llama,
    whose config always holds a resolved ``head_dim``, a head size other than d/h."""
    from .configuration import FixedHeadConfig

    if isinstance(config, FixedHeadConfig):
        return config.is_fixed_head
    return config.head_dim * config.num_attention_heads != config.hidden_size


def new_model(config, objective: str):
    """A freshly initialised language model of ``config`` for ``objective``: fixedhead's
    ``FixedHeadForCausalLM`` / ``FixedHeadForMaskedLM``, or transformers' ``LlamaForCausalLM``.

    Raises:
        ValueError: an objective the architecture cannot train (:func:`check_objective_for`).
    """
    check_objective_for(config, objective)
    if config.model_type == "llama":
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(config)
    from .modeling import FixedHeadForCausalLM, FixedHeadForMaskedLM

    return (FixedHeadForCausalLM if objective == "clm" else FixedHeadForMaskedLM)(config)
