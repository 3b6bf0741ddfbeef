"""fixedhead: fixed head size multi-head attention (Bhojanapalli et al., ICML 2020).

Standard multi-head attention ties the head size to the embedding size (d_p = d/h); this package
decouples it. See README.md.
"""

from .model.attention import MultiHeadAttention
from .model.configuration import FixedHeadConfig
from .model.from_bert import from_bert
from .model.modeling import (
    FixedHeadForCausalLM,
    FixedHeadForMaskedLM,
    FixedHeadForSequenceClassification,
    FixedHeadModel,
    register_auto_classes,
)
from .model.sizes import count_parameters
from .model.surgery import widen_heads

register_auto_classes()  # AutoConfig / AutoModel* / pipeline(...) load fixedhead run directories

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "FixedHeadConfig",
    "FixedHeadModel",
    "FixedHeadForMaskedLM",
    "FixedHeadForCausalLM",
    "FixedHeadForSequenceClassification",
    "count_parameters",
    "from_bert",
    "widen_heads",
]
