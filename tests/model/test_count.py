import pytest

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.modeling import FixedHeadForMaskedLM, FixedHeadModel
from fixedhead.model.paper_presets import PAPER_PRESETS
from fixedhead.model.sizes import count_parameters

# the paper's reported sizes (Tables 1, 2A, 2B, 3), in millions: an independent check on the
# architecture, written here rather than read back from the presets
PAPER = {
    "bert-large-h8": 336,
    "bert-large-h16": 336,
    "bert-large-h32": 336,
    "fixed-d512-h8-dp128": 168,
    "fixed-d512-h12-dp128": 193,
    "fixed-d512-h16-dp128": 218,
    "fixed-d512-h32-dp128": 319,
    "fixed-d512-h8-dp32": 130,
    "fixed-d512-h8-dp64": 142,
    "fixed-d512-h8-dp256": 218,
    "fixed-d768-h8-dp128": 214,
    "fixed-d768-h12-dp128": 252,
    "fixed-d768-h16-dp128": 290,
    "fixed-d768-h20-dp128": 327,
}


def test_every_paper_table_has_a_preset():
    # presets with a reported size are exactly the paper's table rows; the LM1B-style ones have none
    assert set(PAPER) == {n for n, p in PAPER_PRESETS.items() if p.paper_params is not None}
    assert all(n.startswith("lm1b-") for n, p in PAPER_PRESETS.items() if p.paper_params is None)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_parameter_counts_within_one_percent(name):
    n = count_parameters(PAPER_PRESETS[name].build_config())
    assert abs(n / 1e6 - PAPER[name]) / PAPER[name] < 0.01, (name, n)


@pytest.mark.parametrize(
    "kw",
    [
        dict(hidden_size=64, num_attention_heads=4),
        dict(hidden_size=48, num_attention_heads=5, head_dim=32),
        dict(hidden_size=32, num_attention_heads=16, head_dim=64, intermediate_size=48),
    ],
)
def test_formula_matches_a_real_model(kw):
    cfg = FixedHeadConfig(
        vocab_size=301, num_hidden_layers=3, max_position_embeddings=50, **{"intermediate_size": 96, **kw}
    )
    mlm = FixedHeadForMaskedLM(cfg)
    assert count_parameters(cfg, pooler=False) == sum(p.numel() for p in mlm.parameters())
    base = FixedHeadModel(cfg)
    assert count_parameters(cfg, mlm_head=False) == sum(p.numel() for p in base.parameters())
