"""FixedHeadConfig: a BERT configuration whose head size is one independent field.

``head_dim``: None is the standard d/h (paper Section 2), an int the paper's fixed head size (Section 4), a
list one entry per layer. ``qk_head_dim`` and ``v_head_dim`` (DeepSeek-V3's names) size queries and keys
apart from values: Theorem 1 bounds the logits' rank by the first. With both given no layer reads d/h, so d
need not be divisible by h.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass

from transformers import PreTrainedConfig

from .attention import resolve_head_dim
from .checks import non_negative_int, positive_int
from .parametrization import check_parametrization

#: the values of ``problem_type`` (transformers' names); None = inferred from the labels, as BERT
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def _is_token_id(value, vocab_size: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < vocab_size


def _check_prob(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")


@dataclass(repr=False)
class FixedHeadConfig(PreTrainedConfig):
    """Configuration of a post-LN BERT encoder (or decoder) with standard or fixed head size.

    transformers' BERT names, the paper's symbols in brackets: vocab_size [v], hidden_size [d],
    num_hidden_layers [l], num_attention_heads [h], head_dim [d_p], max_position_embeddings [≥ n].
    ``bos_token_id`` / ``eos_token_id``: where generation starts and stops. ``parametrization``,
    ``attention_scale``, ``mup_base_*``, ``query_init``: :mod:`fixedhead.model.parametrization`.
    Bad values raise ValueError naming them (:meth:`check`).
    """

    model_type = "fixedhead"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    head_dim: int | list[int | None] | None = None
    qk_head_dim: int | None = None  # queries and keys: the logits' rank bound; None = head_dim
    v_head_dim: int | None = None  # values; None = head_dim
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    bos_token_id: int | None = None  # generation: the id a prompt starts with (the tokenizer's)
    eos_token_id: int | list[int] | None = None  # generation stops at it (one id or several)
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    is_decoder: bool = False  # causal (left-to-right) attention; FixedHeadForCausalLM sets it
    use_cache: bool = True  # decoders: keep a key/value cache while generating
    # how activations scale with d_p (fixedhead.model.parametrization): "standard" (BERT) or "mup"
    parametrization: str = "standard"
    attention_scale: float | None = None  # a logit scale overriding the parametrization's
    mup_base_head_dim: int | None = None  # the d_p at which "mup" equals "standard"
    mup_base_num_attention_heads: int | None = None  # the h of the base width (default: h)
    query_init: str = "normal"  # "zero": W_q starts at 0

    def __post_init__(self, **kwargs):
        self.check()
        super().__post_init__(**kwargs)

    def check(self) -> None:
        """Check every field; raises ValueError naming the value.

        Runs at construction, after ``from_pretrained`` / ``from_dict`` set their overrides (transformers sets them
        after construction) and when a model is built, so a field changed later is caught before any weight exists.
        """
        positive_int("num_hidden_layers", self.num_hidden_layers)
        for name in ("qk_head_dim", "v_head_dim"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        if isinstance(self.head_dim, (list, tuple)):
            self.head_dim = list(self.head_dim)  # saved as a JSON list, reloaded the same
            self._check_head_dim_count()
            for layer, dp in enumerate(self.head_dim):
                try:
                    self._resolve(dp)
                except ValueError as e:
                    raise ValueError(f"head_dim[{layer}] (layer {layer}): {e}") from None
        else:
            self._resolve(self.head_dim)  # d, h, d_p first
        for name in ("vocab_size", "num_hidden_layers", "intermediate_size", "max_position_embeddings"):
            positive_int(name, getattr(self, name))
        non_negative_int("type_vocab_size", self.type_vocab_size)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_prob(name, getattr(self, name))
        if self.classifier_dropout is not None:
            _check_prob("classifier_dropout", self.classifier_dropout)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, (list, tuple)) and name == "eos_token_id" else [value]
            if value is not None and not all(_is_token_id(i, self.vocab_size) for i in ids):
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size}), got {value!r}")
        if getattr(self, "problem_type", None) is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type must be one of {PROBLEM_TYPES} or None, got {self.problem_type!r}")
        if not (isinstance(self.layer_norm_eps, numbers.Real) and self.layer_norm_eps > 0):
            raise ValueError(f"layer_norm_eps must be a positive float, got {self.layer_norm_eps!r}")
        check_parametrization(self)

    def _resolve(self, head_dim: int | None) -> int:
        """A layer's head size d_p: :func:`resolve_head_dim`, except that with both ``qk_head_dim`` and
        ``v_head_dim`` given no layer reads d/h, so d need not be divisible by h; where it is not, the entry
        reads ``qk_head_dim`` (the size transformers' cache sizes keys by)."""
        if head_dim is None and self.qk_head_dim is not None and self.v_head_dim is not None:
            d = positive_int("hidden_size", self.hidden_size)
            if d % positive_int("num_attention_heads", self.num_attention_heads):
                return self.qk_head_dim
        return resolve_head_dim(self.hidden_size, self.num_attention_heads, head_dim)

    def _check_head_dim_count(self) -> None:
        if isinstance(self.head_dim, list) and len(self.head_dim) != self.num_hidden_layers:
            raise ValueError(
                f"head_dim as a list needs one entry per layer (num_hidden_layers={self.num_hidden_layers}), "
                f"got {len(self.head_dim)} (head_dim={self.head_dim!r})"  # as typed: --head-dim 7,8,9
            )

    def to_dict(self) -> dict:
        """transformers' ``to_dict`` without ``qk_head_dim`` / ``v_head_dim`` when they are None: config.json
        stays byte for byte as before those fields (its hash is in a run's fingerprint)."""
        out = super().to_dict()
        for name in ("qk_head_dim", "v_head_dim"):
            if out.get(name, 0) is None:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """transformers' ``from_dict``, then :meth:`check` again on the overrides it set (e.g.
        ``num_hidden_layers=2`` on a run with a four-entry ``head_dim`` list)."""
        overrides = {k: v for k, v in kwargs.items() if k in cls.__dataclass_fields__}
        loaded = super().from_dict(config_dict, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        try:
            config.check()
        except ValueError as e:
            raise ValueError(f"{e} (after the overrides {overrides})") from None
        return loaded

    @property
    def per_layer_config(self) -> tuple[FixedHeadConfig, ...]:
        """Each layer's configuration where transformers reads one (``config.per_layer_config[i]``: cache sizes):
        a shallow copy with ``head_dim`` that layer's key size as an int, and ``qk_head_dim`` set only where keys and
        values differ (so a ``StaticCache`` sizes them apart)."""
        layers = []
        for qk, v in zip(self.layer_qk_head_dims, self.layer_v_head_dims, strict=True):
            layer = copy.copy(self)
            layer.__dict__.update(head_dim=qk, qk_head_dim=None if qk == v else qk, v_head_dim=v)
            layers.append(layer)
        return tuple(layers)

    @per_layer_config.setter
    def per_layer_config(self, value) -> None:
        raise ValueError(
            f"FixedHeadConfig takes per-layer head sizes as head_dim=[...] (one entry per layer), not "
            f"per_layer_config={value!r}"
        )

    @property
    def layer_head_dims(self) -> list[int]:
        """Every layer's head size d_p, None entries resolved to d/h (to ``qk_head_dim`` where d/h does not exist and
        both ``qk_head_dim`` and ``v_head_dim`` are given: :meth:`_resolve`)."""
        self._check_head_dim_count()
        per_layer = self.head_dim if isinstance(self.head_dim, list) else [self.head_dim] * self.num_hidden_layers
        return [self._resolve(dp) for dp in per_layer]

    @property
    def layer_qk_head_dims(self) -> list[int]:
        """The query and key size of every layer: ``qk_head_dim`` if set, else the layer's head size."""
        return [self.qk_head_dim or dp for dp in self.layer_head_dims]

    @property
    def layer_v_head_dims(self) -> list[int]:
        """The value size of every layer: ``v_head_dim`` if set, else the layer's head size."""
        return [self.v_head_dim or dp for dp in self.layer_head_dims]

    @property
    def attention_head_size(self) -> int:
        """The one head size d_p in use (ValueError when layers differ: use :attr:`layer_head_dims`)."""
        sizes = set(self.layer_head_dims)
        if len(sizes) != 1:
            raise ValueError(
                f"head sizes differ per layer ({self.layer_head_dims}); use config.layer_head_dims for one layer's"
            )
        return sizes.pop()

    @property
    def head_size_label(self) -> int | list[int]:
        """d_p for reports: the int when every layer has the same head size, else the per-layer list."""
        sizes = self.layer_head_dims
        return sizes[0] if len(set(sizes)) == 1 else sizes

    @property
    def is_fixed_head(self) -> bool:
        """Whether some layer's head size is set explicitly (not the standard d/h)."""
        if isinstance(self.head_dim, list):
            return any(dp is not None for dp in self.head_dim)
        return self.head_dim is not None
