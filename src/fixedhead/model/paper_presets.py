"""Named model configurations: the paper's BERT sizes (Tables 1–3) and LM1B-style models (Fig. 1/3a),
each with the parameter count the paper reports (tests/model/test_count.py checks them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `--help` lists the preset names without transformers
    from .configuration import FixedHeadConfig

#: the paper's BERT pretraining setup shared by every table (PAPER.md, "Experiments")
_BERT_COMMON = dict(vocab_size=30522, num_hidden_layers=24, max_position_embeddings=512, type_vocab_size=2)


@dataclass(frozen=True)
class ModelPreset:
    """A named configuration; ``paper_params`` is the paper's reported count in millions (or None)."""

    name: str
    description: str
    config: dict = field(default_factory=dict)
    paper_params: float | None = None
    source: str = ""
    #: the objective the paper trained this model with: "mlm" (BERT, Tables 1-3) or "clm" (LM1B)
    objective: str = "mlm"

    def build_config(self, **overrides) -> FixedHeadConfig:
        from .configuration import FixedHeadConfig

        return FixedHeadConfig(**{**self.config, **overrides})


def _paper(name, source, hidden, heads, head_dim, ffn, params, desc):
    cfg = dict(_BERT_COMMON, hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim, intermediate_size=ffn)
    return ModelPreset(name, desc, cfg, params, source)


PAPER_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        _paper("bert-large-h8", "Table 1", 1024, 8, None, 4096, 336, "BERT-large, 8 standard heads (d_p=128)"),
        _paper("bert-large-h16", "Table 1", 1024, 16, None, 4096, 336, "BERT-large, 16 standard heads (d_p=64)"),
        _paper("bert-large-h32", "Table 1", 1024, 32, None, 4096, 336, "BERT-large, 32 standard heads (d_p=32)"),
        _paper("fixed-d512-h8-dp128", "Table 2A", 512, 8, 128, 4096, 168, "d=512, 8 heads of 128"),
        _paper("fixed-d512-h12-dp128", "Table 2A", 512, 12, 128, 4096, 193, "d=512, 12 heads of 128"),
        _paper("fixed-d512-h16-dp128", "Table 2A", 512, 16, 128, 4096, 218, "d=512, 16 heads of 128"),
        _paper("fixed-d512-h32-dp128", "Table 2A", 512, 32, 128, 4096, 319, "d=512, 32 heads of 128"),
        _paper("fixed-d512-h8-dp32", "Table 2B", 512, 8, 32, 4096, 130, "d=512, 8 heads of 32"),
        _paper("fixed-d512-h8-dp64", "Table 2B", 512, 8, 64, 4096, 142, "d=512, 8 heads of 64"),
        _paper("fixed-d512-h8-dp256", "Table 2B", 512, 8, 256, 4096, 218, "d=512, 8 heads of 256"),
        _paper("fixed-d768-h8-dp128", "Table 3", 768, 8, 128, 3072, 214, "d=768, 8 heads of 128"),
        _paper("fixed-d768-h12-dp128", "Table 3", 768, 12, 128, 3072, 252, "d=768, 12 heads of 128"),
        _paper("fixed-d768-h16-dp128", "Table 3", 768, 16, 128, 3072, 290, "d=768, 16 heads of 128"),
        _paper("fixed-d768-h20-dp128", "Table 3", 768, 20, 128, 3072, 327, "d=768, 20 heads of 128"),
    ]
}


#: the paper's LM1B setup (tensor2tensor, PAPER.md "Experiments"): 6 layers, 32k sub-word vocabulary,
#: sequence length 256, feed-forward 1024. The paper gives no parameter counts for these models. They
#: train as causal (left-to-right) LMs: the paper reports LM1B *test perplexity* from tensor2tensor,
#: whose LM1B problem is next-token language modelling (a masked LM has no such perplexity).
_LM1B_COMMON = dict(
    vocab_size=32000, num_hidden_layers=6, max_position_embeddings=256, intermediate_size=1024, type_vocab_size=2
)


def _lm1b(source, hidden, heads, head_dim=None, kind="LM1B-style"):
    cfg = dict(_LM1B_COMMON, hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim)
    if head_dim is None:
        name = f"lm1b-standard-d{hidden}-h{heads}"
        desc = f"{kind}, d={hidden}, {heads} standard heads (d_p={hidden // heads})"
    else:
        name = f"lm1b-fixed-d{hidden}-h{heads}-dp{head_dim}"
        desc = f"{kind}, d={hidden}, {heads} heads of {head_dim}"
    return ModelPreset(name, desc, cfg, None, source, objective="clm")


LM1B_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # Fig. 1 and 3a: fixed head size d_p = 32 at d = 256, with 4 to 64 heads (the paper: 4-70)
        [_lm1b("Fig. 1/3a (LM1B)", 256, h, 32) for h in (4, 8, 16, 32, 64)]
        # Fig. 3a baseline: standard heads at d = 256 (d_p = 256/h)
        + [_lm1b("Fig. 3a (LM1B)", 256, h) for h in (4, 8, 16, 32, 64)]
        # Fig. 1 baselines: wider standard models, d = 256..512 (the head count of these baselines
        # is not stated in the paper's text; 8 heads here)
        + [_lm1b("Fig. 1 (LM1B)", d, 8, kind="LM1B-style baseline") for d in (320, 384, 448, 512)]
    )
}

#: every named model preset: the BERT sizes of Tables 1-3 and the LM1B-style models of Fig. 1/3a
PAPER_PRESETS.update(LM1B_PRESETS)

#: tokens each paper setup trains on (PAPER.md): BERT 450k steps x 1024 x 128 then 50k x 1024 x 512;
#: LM1B 250k steps x 4096, reading tensor2tensor's batch size as tokens per batch (its convention)
PAPER_TRAINING_TOKENS = {"bert": 450_000 * 1024 * 128 + 50_000 * 1024 * 512, "lm1b": 250_000 * 4096}


def lookup(table: dict, name: str, kind: str):
    """``table[name]``, the one lookup of every preset table (models, compare, sweep, farthest-point,
    widen-experiment). Raises ValueError naming ``kind`` and listing the known names."""
    if name not in table:
        raise ValueError(f"unknown {kind} preset {name!r}; known: {', '.join(table)}")
    return table[name]


def get_preset(name: str) -> ModelPreset:
    """Look up a model preset by name (ValueError listing the known names)."""
    return lookup(PAPER_PRESETS, name, "model")
