"""From transformers' BERT to fixedhead, losslessly: ``BertModel``, ``BertForMaskedLM``, ``BertLMHeadModel``
and ``BertForSequenceClassification`` to their fixedhead counterparts with standard heads, giving BERT's
outputs in float32 eval mode up to rounding (tested to 1e-5).

Every ``BertConfig`` field is in exactly one of :data:`CARRIED`, :data:`REFUSED_UNLESS_DEFAULT` (an
architecture fixedhead lacks) or :data:`NO_EFFECT`; an unknown field (a newer transformers) converts only at
its default, and a test fails until it is classified.
"""

from __future__ import annotations

import dataclasses

import torch

from .configuration import FixedHeadConfig
from .modeling import FixedHeadForCausalLM, FixedHeadForMaskedLM, FixedHeadForSequenceClassification, FixedHeadModel

#: BertConfig fields with the same name and meaning in FixedHeadConfig: copied as they are
CARRIED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "id2label",
    "label2id",
    "problem_type",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "dtype",
    "is_decoder",
    "use_cache",
)
#: fields of architectures fixedhead does not have (a causal or cross-attending BERT): their defaults only
REFUSED_UNLESS_DEFAULT = {
    "add_cross_attention": (False, "cross-attention layers have no fixedhead counterpart"),
    "is_encoder_decoder": (False, "encoder-decoder models have no fixedhead counterpart"),
}
#: fields that do not change what a BERT encoder computes, and why
NO_EFFECT = {
    "chunk_size_feed_forward": "runs the feed-forward in chunks: less memory, identical values",
    "transformers_version": "metadata",
    "architectures": "metadata (the converted model writes its own)",
    "model_type": "metadata (fixedhead)",
    "_name_or_path": "metadata",
}
_SUPPORTED = "BertModel, BertForMaskedLM, BertLMHeadModel or BertForSequenceClassification"


def bert_config_fields(bert_config=None) -> set[str]:
    """Every field a ``BertConfig`` has: its dataclass fields and what ``to_dict`` writes."""
    from transformers import BertConfig

    bert_config = bert_config if bert_config is not None else BertConfig()
    fields = {f.name for f in dataclasses.fields(type(bert_config))} if dataclasses.is_dataclass(bert_config) else set()
    return (fields | set(BertConfig().to_dict())) - {"head_dim"}


def config_from_bert(bert_config) -> FixedHeadConfig:
    """A standard-head ``FixedHeadConfig`` that computes what ``bert_config`` does.

    :data:`CARRIED` fields are copied and extra attributes kept, as transformers does; ``attn_implementation``
    "eager" stays, every other becomes "sdpa" (the same computation).

    Raises:
        ValueError: a field fixedhead cannot carry (:data:`REFUSED_UNLESS_DEFAULT`, relative positions, an
            unclassified field) away from its default.
    """
    from transformers import BertConfig

    values = bert_config.to_dict()
    default = BertConfig().to_dict()
    for name, (ok, why) in REFUSED_UNLESS_DEFAULT.items():
        if values.get(name, ok) != ok:
            raise ValueError(f"cannot convert a BERT config with {name}={values[name]!r}: {why}")
    position_type = values.get("position_embedding_type", "absolute")
    if position_type not in ("absolute", None):
        raise ValueError(
            f"only absolute position embeddings are supported, got position_embedding_type={position_type!r}"
        )
    known = set(CARRIED) | set(REFUSED_UNLESS_DEFAULT) | set(NO_EFFECT)
    fields = bert_config_fields(bert_config)
    for name in sorted(fields - known):
        if name in values and values[name] != default.get(name):
            raise ValueError(
                f"BertConfig field {name}={values[name]!r} is not known to fixedhead.from_bert, which cannot tell "
                f"whether it changes the computation; refusing rather than dropping it"
            )
    if not isinstance(values.get("hidden_act"), str):
        raise ValueError(f"hidden_act must be an activation name to convert, got {values.get('hidden_act')!r}")
    kwargs = {name: values[name] for name in CARRIED if name in values}
    skip = known | fields | {"head_dim", "position_embedding_type"}
    extras = {k: v for k, v in values.items() if k not in skip}
    impl = getattr(bert_config, "_attn_implementation", None)
    return FixedHeadConfig(
        **extras, **kwargs, head_dim=None, attn_implementation="eager" if impl == "eager" else "sdpa"
    )


def _encoder_state_dict(bert_sd: dict, num_layers: int, src: str, dst: str, pooler: bool) -> dict:
    """Rename (and fuse q/k/v of) a BERT encoder state dict; ``src``/``dst`` are the prefixes."""
    out = {}
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        out[f"{dst}embeddings.{name}.weight"] = bert_sd[f"{src}embeddings.{name}.weight"]
    for p in ("weight", "bias"):
        out[f"{dst}embeddings.LayerNorm.{p}"] = bert_sd[f"{src}embeddings.LayerNorm.{p}"]
        if pooler:
            out[f"{dst}pooler.dense.{p}"] = bert_sd[f"{src}pooler.dense.{p}"]
    for i in range(num_layers):
        b, f = f"{src}encoder.layer.{i}.", f"{dst}encoder.layer.{i}."
        for p in ("weight", "bias"):
            out[f"{f}attention.qkv.{p}"] = torch.cat(
                [bert_sd[f"{b}attention.self.{n}.{p}"] for n in ("query", "key", "value")], dim=0
            )
            out[f"{f}attention.out_proj.{p}"] = bert_sd[f"{b}attention.output.dense.{p}"]
            out[f"{f}attention_norm.{p}"] = bert_sd[f"{b}attention.output.LayerNorm.{p}"]
            out[f"{f}intermediate.{p}"] = bert_sd[f"{b}intermediate.dense.{p}"]
            out[f"{f}output.{p}"] = bert_sd[f"{b}output.dense.{p}"]
            out[f"{f}output_norm.{p}"] = bert_sd[f"{b}output.LayerNorm.{p}"]
    return out


def from_bert(bert_model):
    """Convert a transformers BERT model into the fixedhead model that computes the same thing.

    Weights are copied exactly (q, k, v fused); an untied MLM decoder stays untied (read from the weights,
    not only ``tie_word_embeddings``); dtype, device and mode follow the source.

    Raises:
        TypeError: a model with no fixedhead counterpart (the message lists those that have one).
        ValueError: see :func:`config_from_bert`.
    """
    from transformers import BertForMaskedLM, BertForSequenceClassification, BertLMHeadModel, BertModel

    if isinstance(bert_model, BertForMaskedLM):
        kind, encoder = "mlm", bert_model.bert
    elif isinstance(bert_model, BertLMHeadModel):
        if not bert_model.config.is_decoder:
            raise ValueError(
                "a BertLMHeadModel with is_decoder=False attends in both directions; "
                "FixedHeadForCausalLM is causal (set is_decoder=True, as transformers asks)"
            )
        kind, encoder = "clm", bert_model.bert
    elif isinstance(bert_model, BertForSequenceClassification):
        kind, encoder = "cls", bert_model.bert
    elif isinstance(bert_model, BertModel):
        kind, encoder = "base", bert_model
    else:
        raise TypeError(
            f"from_bert converts a transformers {_SUPPORTED}, got {type(bert_model).__name__} "
            f"(heads such as next-sentence prediction have no fixedhead counterpart; convert its .bert for the encoder)"
        )
    bc = bert_model.config
    config = config_from_bert(bc)
    sd = bert_model.state_dict()
    layers = bc.num_hidden_layers
    if kind == "base":
        model = FixedHeadModel(config, add_pooling_layer=encoder.pooler is not None)
        new_sd = _encoder_state_dict(sd, layers, "", "", pooler=encoder.pooler is not None)
    elif kind == "cls":
        model = FixedHeadForSequenceClassification(config)
        new_sd = _encoder_state_dict(sd, layers, "bert.", "fixedhead.", pooler=True)
        for p in ("weight", "bias"):
            new_sd[f"classifier.{p}"] = sd[f"classifier.{p}"]
    else:
        head = bert_model.cls.predictions
        decoder, embedding = head.decoder.weight, encoder.embeddings.word_embeddings.weight
        shares = decoder is embedding or (
            decoder.shape == embedding.shape and decoder.data_ptr() == embedding.data_ptr()
        )
        if config.tie_word_embeddings and not shares and not torch.equal(decoder, embedding):
            config.tie_word_embeddings = False  # the model computes with its own decoder: keep it
        model = (FixedHeadForMaskedLM if kind == "mlm" else FixedHeadForCausalLM)(config)
        new_sd = _encoder_state_dict(sd, layers, "bert.", "fixedhead.", pooler=False)
        for p in ("weight", "bias"):
            new_sd[f"cls.dense.{p}"] = getattr(head.transform.dense, p).detach()
            new_sd[f"cls.LayerNorm.{p}"] = getattr(head.transform.LayerNorm, p).detach()
        new_sd["cls.decoder.weight"] = decoder.detach()
        new_sd["cls.decoder.bias"] = head.decoder.bias.detach() if head.decoder.bias is not None else head.bias.detach()
    missing, unexpected = model.load_state_dict(new_sd, strict=False)
    tied_ok = {"cls.decoder.weight"} if kind in ("mlm", "clm") and config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied_ok:
        raise RuntimeError(f"conversion left missing={missing} unexpected={unexpected}")
    if kind in ("mlm", "clm"):
        model.tie_weights()
        tied = model.cls.decoder.weight is model.fixedhead.embeddings.word_embeddings.weight
        if tied != config.tie_word_embeddings:
            raise RuntimeError(f"conversion: decoder tying is not tie_word_embeddings={config.tie_word_embeddings}")
    param = next(bert_model.parameters())
    return model.to(device=param.device, dtype=param.dtype).train(bert_model.training)
