"""The two model families a study can train, built from one set of field names: ``fixedhead`` (this
library's post-LN BERT-style model, masked or causal) and ``llama`` (transformers' own ``LlamaForCausalLM``,
whose ``head_dim`` sets d_p apart from d/h as the paper asks). :func:`build_config` turns ``FixedHeadConfig``
fields plus an ``architecture`` key into either config."""

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

    Plain multi-head attention unless ``num_key_value_heads`` is given; ``intermediate_size`` defaults to 4d;
    embeddings tied unless told otherwise; dropout and eps fields renamed, ``is_decoder`` and ``type_vocab_size``
    dropped.

    Raises:
        ValueError: a field Llama cannot take (per-layer head sizes, query/key and value sizes that differ, a
            fixedhead-only option away from its default, hidden dropout) or a size ``LlamaConfig`` refuses (an odd
            head size).
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import LlamaConfig

    fields = dict(fields)
    head_dim = fields.pop("head_dim", None)
    if isinstance(head_dim, (list, tuple)):
        raise ValueError(
            f"architecture 'llama' takes one head size for every layer; got per-layer head_dim={list(head_dim)!r}"
        )
    head_dim = _one_head_size(head_dim, fields.pop("qk_head_dim", None), fields.pop("v_head_dim", None), fields)
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


def _one_head_size(head_dim, qk_head_dim, v_head_dim, fields: dict):
    """Llama's one ``head_dim`` from fixedhead's three head-size fields: accepted where every one given (and d/h
    for ``head_dim`` left out beside a query/key or value size) is the same size. The refusal writes fields as
    ``field=value``, which the command line rewrites as its options (``--qk-head-dim 4``)."""
    sizes = {"qk_head_dim": qk_head_dim, "v_head_dim": v_head_dim}
    sizes = {name: size for name, size in sizes.items() if size is not None}
    if not sizes:
        return head_dim
    d, h = fields.get("hidden_size"), fields.get("num_attention_heads")
    standard = d // h if isinstance(d, int) and isinstance(h, int) and h > 0 and d % h == 0 else None
    if head_dim is None and len(sizes) == 2 and qk_head_dim == v_head_dim:
        return qk_head_dim  # both given: no layer reads d/h
    one = head_dim if head_dim is not None else standard
    if all(size == one for size in sizes.values()):
        return head_dim
    name, size = next((n, s) for n, s in sizes.items() if s != one)
    shown = f"head_dim={head_dim}" if head_dim is not None else "head_dim=None" + (f" (d/h = {one})" if one else "")
    raise ValueError(
        f"{name}={size} with {shown}: architecture='llama' (transformers' LlamaForCausalLM) has one head size for "
        f"queries, keys and values; give head_dim alone, or architecture='fixedhead' for separate sizes"
    )


def build_config(fields: dict):
    """The config for ``FixedHeadConfig`` fields and an optional ``architecture`` (default ``"fixedhead"``):
    a :class:`FixedHeadConfig` or :func:`llama_config`'s. Raises ValueError naming a refused field."""
    from .configuration import FixedHeadConfig  # here: the command line reads ARCHITECTURES without transformers

    fields = dict(fields)
    architecture = check_architecture(fields.pop("architecture", "fixedhead"))
    return llama_config(**fields) if architecture == "llama" else FixedHeadConfig(**fields)


def objective_of(config) -> str:
    """``"clm"`` for a causal language model's config (a fixedhead decoder, any Llama), else ``"mlm"``."""
    return "clm" if config.model_type == "llama" or getattr(config, "is_decoder", False) else "mlm"


def check_objective_for(config, objective: str) -> None:
    """Refuse an objective the architecture cannot train (Llama is causal only); ValueError naming both."""
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
    """Whether the head size is set apart from d/h (for Llama, whose config always holds one: a size other than d/h)."""
    from .configuration import FixedHeadConfig

    if isinstance(config, FixedHeadConfig):
        return config.is_fixed_head
    return config.head_dim * config.num_attention_heads != config.hidden_size


def new_model(config, objective: str):
    """A freshly initialised language model of ``config`` for ``objective`` (ValueError where the architecture
    cannot train it)."""
    check_objective_for(config, objective)
    if config.model_type == "llama":
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(config)
    from .modeling import FixedHeadForCausalLM, FixedHeadForMaskedLM

    return (FixedHeadForCausalLM if objective == "clm" else FixedHeadForMaskedLM)(config)
