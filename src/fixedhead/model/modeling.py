"""BERT-style encoders and a decoder with standard or fixed head size, as transformers models.

Post-LN blocks as in BERT and the paper (Section 2): Z = LN(X + MultiHead(X)), then LN(Z + FFN(Z)), GELU,
learned absolute positions and token types, tied embeddings. ``config.head_dim=None`` is numerically BERT
(:func:`fixedhead.from_bert`); an int gives the paper's fixed-head models. transformers' contract holds as
for ``BertModel`` and its heads; which value checks run where is :mod:`fixedhead.model.tensor_checks`.
"""

from __future__ import annotations

import errno
import warnings

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    SequenceClassifierOutput,
)
from transformers.utils.deprecation import deprecate_kwarg

from .attention import MultiHeadAttention, _is_prepared_mask, check_head_dims, check_padding_mask
from .configuration import FixedHeadConfig
from .losses import check_token_labels, infer_problem_type, masked_lm_loss_and_logits, sequence_classification_loss
from .parametrization import attention_scale, output_projection_multiplier
from .tensor_checks import (
    check_broadcast_ids_shape,
    check_finite,
    check_integer,
    first_out_of_range,
    require_tensor,
    tracing,
)


def refuse_unsuitable_cache(cache: Cache, device: torch.device) -> None:
    """Refuse, by name, a key/value cache that cannot hold what fixedhead's attention reads.

    Every layer attends to all earlier tokens, so a sliding-window cache would silently change the model; an
    offloading cache needs CUDA streams, which a CPU model lacks.

    Raises:
        ValueError: a cache with sliding-window layers, or an offloading cache on a CPU model.
    """
    if not isinstance(cache, Cache):
        raise ValueError(
            f"cache must be a transformers Cache (e.g. DynamicCache, StaticCache), got {type(cache).__name__}"
        )
    sliding = [i for i, is_sliding in enumerate(cache.is_sliding) if is_sliding]
    if sliding:
        raise ValueError(
            f"{type(cache).__name__} has sliding-window layers ({sliding}), which keep only the last keys; fixedhead "
            f"attends to every earlier token: use a DynamicCache or StaticCache"
        )
    if getattr(cache, "offloading", False) and torch.device(device).type != "cuda":
        raise ValueError(
            f"{type(cache).__name__} with offloading=True moves cache layers from a GPU to the CPU (CUDA streams); "
            f"this model runs on {torch.device(device).type}: use a cache without offloading"
        )


def packed_sequence_ids(kwargs: dict, batch: int, seq: int, device) -> torch.Tensor | None:
    """Which packed sequence each token belongs to, [batch, seq], or None, from the keys transformers'
    ``DataCollatorWithFlattening`` adds: ``seq_idx`` ([batch or 1, seq]) or ``cu_seq_lens_q`` (cumulative
    lengths of one flattened row). Raises ValueError for a wrong shape or lengths not ending at the row's."""
    seq_idx, cu = kwargs.get("seq_idx"), kwargs.get("cu_seq_lens_q")
    if seq_idx is not None:
        seq_idx = torch.as_tensor(seq_idx, device=device)
        if seq_idx.dim() == 1:
            seq_idx = seq_idx.unsqueeze(0)
        if seq_idx.dim() != 2 or seq_idx.shape[0] not in (1, batch) or seq_idx.shape[1] != seq:
            raise ValueError(f"seq_idx must be [batch, seq] = {(batch, seq)}, got {tuple(seq_idx.shape)}")
        return seq_idx.expand(batch, seq)
    if cu is not None:
        cu = torch.as_tensor(cu, device=device)
        if batch != 1 or cu.dim() != 1 or (not tracing() and int(cu[-1]) != seq):
            raise ValueError(
                f"cu_seq_lens_q describes one flattened row of {seq} tokens ([1, seq] inputs, cumulative lengths "
                f"ending at {seq}), got batch {batch} and {cu.tolist() if not tracing() else tuple(cu.shape)}"
            )
        return torch.bucketize(torch.arange(seq, device=device), cu[1:], right=True).unsqueeze(0)
    return None


class FixedHeadEmbeddings(nn.Module):
    """Word + absolute position + token type embeddings, then LayerNorm and dropout (as BERT).

    Table sizes are read from the tables at every call, so after ``resize_token_embeddings`` or a replaced
    table, ids are checked against the table that will be indexed.
    """

    def __init__(self, config: FixedHeadConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(max(config.type_vocab_size, 1), config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache_length: int = 0,
    ) -> torch.Tensor:
        """Embed [batch, seq] ids (or take [batch, seq, hidden] ``inputs_embeds``); returns [batch, seq, hidden].

        ``token_type_ids`` and ``position_ids``: [batch, seq], or [1, seq] / [seq] shared by all rows;
        ``token_type_ids`` also one per row ([batch, 1]) as BERT's sum broadcasts it. Without ``position_ids``
        tokens sit after the ``cache_length`` tokens already cached.
        """
        hidden = self.LayerNorm.normalized_shape[0]
        if inputs_embeds is None:
            check_integer("input_ids", input_ids, "an integer tensor of token ids")
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
            if input_ids.numel() == 0:
                raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)})")
            vocab = self.word_embeddings.weight.shape[0]
            bad = first_out_of_range(input_ids, 0, vocab)
            if bad is not None:
                raise ValueError(
                    f"input_ids hold token id {bad[0]}, outside the vocabulary [0, {vocab}) (at index {bad[1]})"
                )
            inputs_embeds = self.word_embeddings(input_ids)
        else:
            require_tensor("inputs_embeds", inputs_embeds)
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden:
                raise ValueError(
                    f"inputs_embeds must be [batch, seq, hidden_size={hidden}], got shape {tuple(inputs_embeds.shape)}"
                )
            if not inputs_embeds.is_floating_point():
                raise ValueError(f"inputs_embeds must be a floating-point tensor, got dtype {inputs_embeds.dtype}")
            if inputs_embeds.numel() == 0:
                raise ValueError(f"inputs_embeds is empty (shape {tuple(inputs_embeds.shape)})")
            # documented choice: refuse rather than propagate; one NaN would spread to every
            # position of the batch row through attention
            check_finite("inputs_embeds", inputs_embeds)
        batch, seq = inputs_embeds.shape[:2]
        n_positions = self.position_embeddings.weight.shape[0]
        if position_ids is None:
            if cache_length + seq > n_positions:
                what = f"sequence length {seq}" if not cache_length else f"{cache_length} cached + {seq} new tokens"
                raise ValueError(f"{what} exceeds max_position_embeddings={n_positions}")
            position_embeds = self.position_embeddings.weight[cache_length : cache_length + seq].unsqueeze(0)
        else:
            check_integer("position_ids", position_ids)
            check_broadcast_ids_shape("position_ids", position_ids, batch, seq)
            bad = first_out_of_range(position_ids, 0, n_positions)
            if bad is not None:
                raise ValueError(
                    f"position_ids hold {bad[0]}, outside [0, max_position_embeddings={n_positions}) "
                    f"(at index {bad[1]})"
                )
            position_embeds = self.position_embeddings(position_ids)
        if token_type_ids is None:
            type_embeds = self.token_type_embeddings.weight[0].view(1, 1, -1)
        else:
            check_integer("token_type_ids", token_type_ids)
            # [batch, 1] / [1, 1] / [1]: one type for every token of a row, broadcast as BERT's sum does
            # (transformers' export-style decode joins two steps' input_ids but keeps one step's types)
            if tuple(token_type_ids.shape) not in ((batch, 1), (1, 1), (1,)):
                check_broadcast_ids_shape("token_type_ids", token_type_ids, batch, seq)
            n_types = self.token_type_embeddings.weight.shape[0]
            bad = first_out_of_range(token_type_ids, 0, n_types)
            if bad is not None:
                raise ValueError(
                    f"token_type_ids hold {bad[0]}, outside [0, type_vocab_size={n_types}) (at index {bad[1]})"
                )
            type_embeds = self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(inputs_embeds + position_embeds + type_embeds))


class FixedHeadLayer(GradientCheckpointingLayer):
    """One post-LN encoder block: LN(X + Attn(X)), then LN(Z + FFN(Z)) (paper Section 2).

    A ``GradientCheckpointingLayer``: the cache arrives as a keyword so that checkpointing drops it, and a
    recomputed block does not append its keys twice.
    """

    def __init__(self, config: FixedHeadConfig, layer_idx: int | None = None):
        super().__init__()
        layer = layer_idx or 0
        qk_head_dim, v_head_dim = config.layer_qk_head_dims[layer], config.layer_v_head_dims[layer]
        self.attention = MultiHeadAttention(
            config.hidden_size,
            config.num_attention_heads,
            head_dim=config.layer_head_dims[layer],
            qk_head_dim=qk_head_dim,
            v_head_dim=v_head_dim,
            dropout=config.attention_probs_dropout_prob,
            layer_idx=layer_idx,
            scale=attention_scale(config, qk_head_dim),
            config=config,
        )
        # marks read by _init_weights: μP's W_o std (its fan-in is h·d_v), and W_q (the first h·d_qk rows
        # of the fused projection) at 0
        self.attention.out_proj.init_std_factor = output_projection_multiplier(config, v_head_dim)
        self.attention.qkv.zero_init_rows = self.attention.qk_size if config.query_init == "zero" else 0
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | BlockMask | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
        is_causal: bool | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states [batch, seq, hidden] -> ([batch, seq, hidden], probabilities [batch, heads, seq, keys]
        or None); the arguments as in :class:`MultiHeadAttention`."""
        attn_out, probs = self.attention(
            hidden_states,
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            is_causal=is_causal,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.attention_norm(hidden_states + self.dropout(attn_out))
        ffn_out = self.output(self.act(self.intermediate(hidden_states)))
        hidden_states = self.output_norm(hidden_states + self.dropout(ffn_out))
        return hidden_states, probs


class FixedHeadPreTrainedModel(PreTrainedModel):
    """HF plumbing; transformers' default init is BERT's (N(0, initializer_range), zero biases, unit LayerNorms)."""

    config_class = FixedHeadConfig
    config: FixedHeadConfig
    base_model_prefix = "fixedhead"
    supports_gradient_checkpointing = True
    _no_split_modules = ["FixedHeadEmbeddings", "FixedHeadLayer"]
    # attention runs through transformers' attention interface (fixedhead.model.attention), so every
    # implementation it registers applies: eager, sdpa, flex_attention, flash_attention_2/3 and the
    # serving engines' own
    _supports_attention_backend = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _can_compile_fullgraph = True

    def __init__(self, config: FixedHeadConfig, *inputs, **kwargs):
        config.check()  # fields changed after the config was built (overrides, setattr) are refused here
        super().__init__(config, *inputs, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``; a class registered for an Auto class also writes its modeling code.

        transformers copies this module and the modules it imports (:func:`remote_code_files`) beside config.json,
        whose ``auto_map`` (:func:`auto_map`) lets every ``AutoModel*`` class open the folder with
        ``trust_remote_code=True`` where fixedhead is not installed.

        Raises:
            OSError: a full disk or file-size limit, naming ``save_directory``.
        """
        if self.is_remote_code():
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **auto_map()}
        try:
            return super().save_pretrained(save_directory, *args, **kwargs)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            raise OSError(e.errno, f"{e.strerror} while writing the model", str(save_directory)) from None

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        # the parametrization's initialisation (FixedHeadLayer marks the projections it changes)
        factor = getattr(module, "init_std_factor", 1.0)
        if factor != 1.0:
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range * factor)
        rows = getattr(module, "zero_init_rows", 0)
        if rows and not getattr(module.weight, "_is_hf_initialized", False):
            init.zeros_(module.weight[:rows])
            if module.bias is not None:
                init.zeros_(module.bias[:rows])

    def _check_and_adjust_attn_implementation(self, attn_implementation: str | None, *args, **kwargs) -> str:
        """transformers' choice, after refusing an implementation that cannot take the head sizes
        (:func:`~fixedhead.model.attention.check_head_dims`), before a package is imported, a hub kernel fetched
        or weights read (vLLM sets its own implementation before it builds the model)."""
        for qk_head_dim, v_head_dim in zip(self.config.layer_qk_head_dims, self.config.layer_v_head_dims, strict=True):
            check_head_dims(attn_implementation, qk_head_dim, v_head_dim)
        return super()._check_and_adjust_attn_implementation(attn_implementation, *args, **kwargs)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """transformers' choice after the same head-size refusal (its path for names that are not hub kernels)."""
        for qk_head_dim, v_head_dim in zip(self.config.layer_qk_head_dims, self.config.layer_v_head_dims, strict=True):
            check_head_dims(requested_attention, qk_head_dim, v_head_dim)
        return super().get_correct_attn_implementation(requested_attention, is_init_check)


class FixedHeadModel(FixedHeadPreTrainedModel):
    """The bare encoder (with ``config.is_decoder``: a causal decoder): embeddings, ``num_hidden_layers`` blocks,
    an optional BERT pooler; ``use_cache`` / ``cache`` keep a transformers ``Cache`` for generation.

    forward(input_ids [batch, seq] | inputs_embeds [batch, seq, hidden], attention_mask [batch, seq] (1 = token,
    [batch, cached + new] with a cache), token_type_ids, position_ids) returns
    ``BaseModelOutputWithPoolingAndCrossAttentions``: last_hidden_state [batch, seq, hidden_size], pooler_output
    [batch, hidden_size] or None, on request hidden_states and attentions [batch, heads, query, key]. A row whose
    mask is all 0 gives finite (meaningless) outputs. Bad input raises ValueError (TypeError for a non-tensor)
    naming the value.
    """

    def __init__(self, config: FixedHeadConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = FixedHeadEmbeddings(config)
        self.encoder = nn.ModuleDict(
            {"layer": nn.ModuleList(FixedHeadLayer(config, layer_idx=i) for i in range(config.num_hidden_layers))}
        )
        self.pooler = FixedHeadPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _attention_mask(self, attention_mask, embeds, cache, position_ids, is_causal, output_attentions, kwargs):
        """The mask every layer gets, made once by transformers' masking utilities for the implementation;
        None when the kernel needs none, a 4-D mask taken as prepared.

        Decoder: ``create_causal_mask``, sized by the cache; without mask or cache, restarting ``position_ids``
        mark packed sequences (transformers' decoder rule). Encoder: ``create_bidirectional_mask`` given
        ``position_ids`` as BERT gives them, so it does what the installed release's BERT does (from 5.25 restarting
        positions mark packed sequences; tests/test_contract.py compares). ``seq_idx`` / ``cu_seq_lens_q`` from
        ``DataCollatorWithFlattening`` also keep packed sequences apart.

        Raises:
            ValueError: ``output_attentions`` with an implementation that computes no probabilities.
        """
        batch, seq = embeds.shape[:2]
        impl = self.config._attn_implementation
        if output_attentions and impl not in ("eager", "sdpa"):
            raise ValueError(
                f"output_attentions=True computes the attention probabilities with the eager kernel, from the mask "
                f"of 'eager' or 'sdpa'; this model is set to attn_implementation={impl!r}: "
                f"call model.set_attn_implementation('eager') first"
            )
        if attention_mask is not None and not _is_prepared_mask(attention_mask):
            past = cache.get_seq_length() if cache is not None else 0
            keys = past + seq if isinstance(past, int) else None  # a static cache counts in a tensor
            what = "[batch, seq]" if cache is None or not past else "[batch, cached + new tokens]"
            attention_mask = check_padding_mask(attention_mask, batch, keys, what)
        if is_causal:
            return create_causal_mask(
                config=self.config,
                inputs_embeds=embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
        packed = packed_sequence_ids(kwargs, batch, seq, embeds.device) if attention_mask is None else None
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            # explicit sequence ids take precedence: transformers 5.25 calls mask functions with per-sequence
            # positions once it finds packing in position_ids, which the seq_idx mask cannot read
            position_ids=position_ids if packed is None else None,
            and_mask_function=None if packed is None else packed_sequence_mask_function(packed),
        )

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions | tuple:
        """See the class docstring (``cache`` set in the output when a decoder uses one)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        is_causal = bool(self.config.is_decoder)
        use_cache = bool(use_cache if use_cache is not None else self.config.use_cache) and is_causal
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if cache is not None and not is_causal:
            raise ValueError("a key/value cache is for decoders (config.is_decoder=True, e.g. FixedHeadForCausalLM)")
        cache_length = 0
        if cache is not None:
            refuse_unsuitable_cache(cache, self.embeddings.word_embeddings.weight.device)
            cache_length = cache.get_seq_length()
            if isinstance(cache_length, torch.Tensor):
                # a static cache counts its tokens in a tensor (no host read under compile): the new
                # tokens' positions are computed from it, as transformers' models do
                source = input_ids if input_ids is not None else inputs_embeds
                if position_ids is None and isinstance(source, torch.Tensor) and source.dim() >= 2:
                    position_ids = (torch.arange(source.shape[1], device=source.device) + cache_length).unsqueeze(0)
                cache_length = 0
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, cache_length)
        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)  # [seq] shared by all rows (as BERT) -> [1, seq]
        mask = self._attention_mask(
            attention_mask, hidden_states, cache, position_ids, is_causal, output_attentions, kwargs
        )
        all_hidden = [hidden_states] if output_hidden_states else None
        all_attn = [] if output_attentions else None
        for layer in self.encoder["layer"]:
            hidden_states, probs = layer(
                hidden_states,
                attention_mask=mask,
                cache=cache,
                output_attentions=output_attentions,
                is_causal=is_causal,
                position_ids=position_ids,
                **kwargs,
            )
            if output_hidden_states:
                all_hidden.append(hidden_states)
            if output_attentions:
                all_attn.append(probs)
        pooled = self.pooler(hidden_states) if self.pooler is not None else None
        out = BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            cache=cache if use_cache else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
        )
        return out if return_dict else out.to_tuple()


class FixedHeadPooler(nn.Module):
    """BERT pooler: tanh(W · hidden state of the first token)."""

    def __init__(self, config: FixedHeadConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, hidden] (the first token's state)."""
        return self.activation(self.dense(hidden_states[:, 0]))


class FixedHeadLMHead(nn.Module):
    """The LM head of both objectives, laid out as BERT's MLM head: dense + activation + LayerNorm, then
    the (tied) decoder to the vocabulary."""

    def __init__(self, config: FixedHeadConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> logits [..., vocab]."""
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden_states))))


class FixedHeadForMaskedLM(FixedHeadPreTrainedModel):
    """Encoder + MLM head (decoder tied to the word embeddings unless ``tie_word_embeddings=False``).

    forward(..., labels [batch, seq], -100 = not scored) returns ``MaskedLMOutput`` with logits
    [batch, seq, vocab_size] as ``BertForMaskedLM``. With labels the output layer runs only at the labelled
    positions (:func:`masked_lm_loss_and_logits`; logits elsewhere are 0); the loss is the mean cross-entropy
    there (0 with a zero gradient when nothing is labelled). Labels outside the vocabulary raise ValueError.
    """

    #: the Trainer passes num_items_in_batch: the loss averages over the global batch's masked tokens
    accepts_loss_kwargs = True
    _tied_weights_keys = {"cls.decoder.weight": "fixedhead.embeddings.word_embeddings.weight"}

    def __init__(self, config: FixedHeadConfig):
        super().__init__(config)
        if config.is_decoder:  # as BertForMaskedLM: allowed (causal attention), but rarely meant
            warnings.warn(
                "FixedHeadForMaskedLM built from a decoder config (is_decoder=True): its attention is causal, "
                "so each masked token sees only the tokens before it; a causal run is meant for "
                "FixedHeadForCausalLM / AutoModelForCausalLM / pipeline('text-generation')",
                stacklevel=2,
            )
        self.fixedhead = FixedHeadModel(config, add_pooling_layer=False)
        self.cls = FixedHeadLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.decoder = new_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        """See the class docstring."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.fixedhead(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,  # attention kwargs, e.g. packed sequences' seq_idx / cu_seq_lens_q
        )
        sequence_output = outputs.last_hidden_state
        loss = None
        if labels is None:
            logits = self.cls(sequence_output)
        else:
            vocab = check_token_labels(labels, sequence_output, self.cls.decoder)
            loss, logits = masked_lm_loss_and_logits(self.cls, sequence_output, labels, vocab, num_items_in_batch)
        out = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return out if return_dict else out.to_tuple()


class FixedHeadForCausalLM(FixedHeadPreTrainedModel, GenerationMixin):
    """A decoder-only language model with standard or fixed head size (``config.is_decoder`` set to True).

    The encoders' blocks with causal attention and the MLM head as LM head, tied by default (transformers'
    ``BertLMHeadModel`` layout); works with ``generate`` and ``pipeline("text-generation")``.
    forward(input_ids, attention_mask [batch, cached + new], labels [batch, seq] (-100 = not scored), cache,
    use_cache, logits_to_keep) returns ``CausalLMOutputWithCrossAttentions``: logits [batch, seq, vocab] (or the
    last ``logits_to_keep``), loss = mean next-token cross-entropy (``ForCausalLMLoss`` shifts labels inside).
    """

    _tied_weights_keys = {"cls.decoder.weight": "fixedhead.embeddings.word_embeddings.weight"}

    def __init__(self, config: FixedHeadConfig):
        trained_as = [a for a in (config.architectures or []) if a != type(self).__name__]
        if not config.is_decoder and trained_as:
            # as BertLMHeadModel warns on an encoder config: a masked-LM run opened here
            # (AutoModelForCausalLM, the text-generation pipeline) was trained attending both ways.
            # A fresh config (no architectures yet) is simply made causal: that is this class.
            warnings.warn(
                f"FixedHeadForCausalLM built from an encoder checkpoint's config (is_decoder=False, "
                f"architectures={config.architectures}): it was trained with bidirectional attention, which "
                "is made causal here, so what it generates is not meaningful; pretrain with the causal "
                "objective for a language model that generates",
                stacklevel=2,
            )
        config.is_decoder = True  # this class is the decoder; an encoder config becomes a decoder one
        super().__init__(config)
        self.fixedhead = FixedHeadModel(config, add_pooling_layer=False)
        self.cls = FixedHeadLMHead(config)
        self.post_init()

    def _validate_generated_length(self, generation_config, input_ids_length, has_default_max_length):
        """transformers' length checks, then the position table's: L tokens embed their first L − 1, so L may
        reach max_position_embeddings + 1 (as GPT-2); longer is refused before the first forward pass."""
        super()._validate_generated_length(generation_config, input_ids_length, has_default_max_length)
        n_positions = self.fixedhead.embeddings.position_embeddings.weight.shape[0]
        if generation_config.max_length - 1 > n_positions:
            raise ValueError(
                f"generating up to {generation_config.max_length} tokens (a prompt of {input_ids_length} and up to "
                f"{generation_config.max_length - input_ids_length} new ones) needs {generation_config.max_length - 1} "
                f"positions, more than max_position_embeddings={n_positions} (learned positions end there): "
                f"ask for at most {n_positions + 1 - input_ids_length} new tokens"
            )

    def get_output_embeddings(self):
        return self.cls.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.decoder = new_embeddings

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ):
        """See the class docstring."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None:
            use_cache = False  # training: nothing to keep
        outputs = self.fixedhead(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            cache=cache,
            use_cache=use_cache,
            **kwargs,  # attention kwargs (e.g. FlashAttention's cu_seq_lens_q for packed sequences)
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.cls(hidden_states[:, keep])
        loss = None
        if labels is not None:
            vocab = check_token_labels(labels, hidden_states, self.cls.decoder)
            if logits.shape[1] != labels.shape[1]:
                raise ValueError("labels need logits at every position: pass logits_to_keep=0 with labels")
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=vocab, **kwargs)
        out = CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return out if return_dict else out.to_tuple()


class FixedHeadForSequenceClassification(FixedHeadPreTrainedModel):
    """Encoder + BERT pooler + dropout + linear classifier (GLUE-style fine-tuning).

    forward(..., labels) returns ``SequenceClassifierOutput`` with logits [batch, num_labels] and, with labels,
    the loss ``BertForSequenceClassification`` gives for ``config.problem_type``
    (:func:`sequence_classification_loss`); a None ``problem_type`` is inferred and recorded, as BERT does.
    """

    def __init__(self, config: FixedHeadConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.fixedhead = FixedHeadModel(config, add_pooling_layer=True)
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(drop)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> SequenceClassifierOutput | tuple:
        """labels [batch] (classes or regression targets) or [batch, num_labels]; see the class docstring."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.fixedhead(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            require_tensor("labels", labels)
            problem_type = self.config.problem_type
            if problem_type is None:
                problem_type = infer_problem_type(logits.shape[-1], labels)
                if not tracing():  # a config write is a side effect a compiled graph cannot hold
                    self.config.problem_type = problem_type
            loss = sequence_classification_loss(problem_type, logits, labels)
        out = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return out if return_dict else out.to_tuple()


# --------------------------------------------------------------------------------------------
# transformers Auto classes
# --------------------------------------------------------------------------------------------


#: the Auto class that loads each model class; a saved run names them all in config.json's ``auto_map``
AUTO_CLASSES = {
    "AutoModel": FixedHeadModel,
    "AutoModelForMaskedLM": FixedHeadForMaskedLM,
    "AutoModelForCausalLM": FixedHeadForCausalLM,
    "AutoModelForSequenceClassification": FixedHeadForSequenceClassification,
}


def auto_map() -> dict[str, str]:
    """config.json's ``auto_map``: Auto class name -> ``"modeling.Class"`` for ``AutoConfig`` and the model classes
    of :data:`AUTO_CLASSES`, so any of them opens any fixedhead run (a masked-LM run as a classifier, say)."""
    classes = {"AutoConfig": FixedHeadConfig, **AUTO_CLASSES}
    return {auto: f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}" for auto, cls in classes.items()}


def remote_code_files() -> tuple[str, ...]:
    """The code files ``save_pretrained`` writes beside config.json (sorted): this module and what it imports
    relatively, followed as transformers follows them (so the model folder imports nothing else of fixedhead)."""
    from pathlib import Path

    from transformers.dynamic_module_utils import get_relative_import_files

    return tuple(sorted({Path(__file__).name, *(Path(f).name for f in get_relative_import_files(__file__))}))


def register_auto_classes() -> None:
    """Register ``FixedHeadConfig`` and the models with transformers' Auto classes (idempotent).

    Called on import, so Auto classes and ``pipeline`` load a ``model_type: "fixedhead"`` run without
    ``trust_remote_code``; each class is also registered for its Auto class so ``save_pretrained`` writes the
    code and ``auto_map`` for machines without fixedhead.
    """
    import transformers

    transformers.AutoConfig.register(FixedHeadConfig.model_type, FixedHeadConfig, exist_ok=True)
    FixedHeadConfig.register_for_auto_class("AutoConfig")
    for auto_class, model_class in AUTO_CLASSES.items():
        getattr(transformers, auto_class).register(FixedHeadConfig, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_class)
