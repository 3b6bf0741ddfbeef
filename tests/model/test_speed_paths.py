"""The attention kernel policy: SDPA backend choice on CUDA and its one-time warning, fp16 bias,
and the CPU training path with attention dropout. (BERT parity and the masked-only MLM output are
tested in test_modeling.py and test_contract.py, padding and bf16 autocast in test_numerics.py.)"""

import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from fixedhead.model import attention, kernels
from fixedhead.model.attention import MultiHeadAttention
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.kernels import sdpa_backends, warn_if_unfused
from fixedhead.model.modeling import FixedHeadForMaskedLM

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def batch(b=3, n=10, vocab=97, pad_last=True):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    if pad_last:
        mask[-1, 6:] = 0
    labels = torch.full((b, n), -100)
    labels[:, ::3] = ids[:, ::3]
    return ids, mask, labels


def test_fp16_bias_stays_finite():
    layer = MultiHeadAttention(16, 2)
    bias = attention.padding_mask_to_bias(torch.tensor([[0, 0, 0]]), torch.float32)
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        out, _ = layer.half()(x.half(), attention_bias=bias, use_sdpa=False)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "head_dim, fused, flash",
    [
        (64, True, True),
        (128, True, True),
        (256, True, True),
        (512, False, False),
        (260, False, False),
        (60, False, False),
        (12, False, False),
    ],
)
def test_sdpa_backends_cuda(head_dim, fused, flash):
    backends, reason = sdpa_backends(head_dim, "cuda")
    assert backends[-1] == SDPBackend.MATH  # never fails, math is the last resort
    assert (SDPBackend.FLASH_ATTENTION in backends) == flash
    assert (reason is None) == fused
    if head_dim > 256:
        assert "256" in reason
    if head_dim % 8:
        assert "multiple of 8" in reason


def test_sdpa_backends_leaves_cpu_to_pytorch():
    assert sdpa_backends(512, "cpu") == (None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_unfused(500, "cpu")  # no warning off CUDA


def test_warns_once_per_head_dim(monkeypatch):
    monkeypatch.setattr(kernels, "_warned_sdpa", set())
    with pytest.warns(UserWarning, match="head_dim=512 > 256"):
        warn_if_unfused(512, "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_unfused(512, "cuda")  # second time: silent
        warn_if_unfused(128, "cuda")  # fine head size: silent
    with pytest.warns(UserWarning, match="multiple of 8"):
        warn_if_unfused(20, "cuda")


@cuda
def test_cuda_forward_warns_and_matches_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "_warned_sdpa", set())
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, head_dim=300).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        ref, _ = layer(x)
        with pytest.warns(UserWarning, match="300"):
            out, _ = layer.cuda()(x.cuda())
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)


@cuda
def test_cuda_bf16_autocast_training_step():
    torch.manual_seed(0)
    cfg = FixedHeadConfig(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=16,
    )
    model = FixedHeadForMaskedLM(cfg).cuda().train()
    ids, mask, labels = (t.cuda() for t in batch())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)


# --- CPU training fast path: attention with dropout ------------------------------


def _fixed_mask(monkeypatch, seed=3):
    """Make the kernel draw the same mask at every call (for the reference and gradcheck)."""
    masks = []

    def mask(like, p):
        g = torch.Generator().manual_seed(seed)
        m = (torch.rand(like.shape, generator=g, dtype=like.dtype) >= p).to(like.dtype) / (1 - p)
        masks.append(m)
        return m

    monkeypatch.setattr(kernels, "_dropout_scale_mask", mask)
    return masks


@pytest.mark.parametrize("with_bias", [False, True])
def test_dropout_attention_matches_math_with_the_same_mask(monkeypatch, with_bias):
    masks = _fixed_mask(monkeypatch)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = attention.padding_mask_to_bias(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), torch.float64)
    bias = bias if with_bias else None
    p, scale = 0.3, 0.5
    out = kernels.DropoutAttention.apply(q, k, v, bias, p, scale)
    scores = q @ k.transpose(-1, -2) * scale + (0 if bias is None else bias)
    ref = (torch.softmax(scores, -1) * masks[0].view(2, 3, 5, 5)) @ v
    torch.testing.assert_close(out, ref)
    assert torch.autograd.gradcheck(lambda q, k, v: kernels.DropoutAttention.apply(q, k, v, bias, p, scale), (q, k, v))


def test_training_attention_probability_dropout_statistics():
    # the CPU dropout-attention path: output is an unbiased estimate of the dropout-free one
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, dropout=0.5).train()
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        mean = torch.stack([layer(x)[0] for _ in range(4000)]).mean(0)
        ref, _ = layer.eval()(x)
    torch.testing.assert_close(mean, ref, atol=0.03, rtol=0)


def test_training_step_with_the_dropout_attention_kernel_is_finite():
    torch.manual_seed(0)
    cfg = FixedHeadConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    model = FixedHeadForMaskedLM(cfg).train()
    ids, mask, labels = batch()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_attention_value_size_and_no_silent_second_backward(monkeypatch):
    masks = _fixed_mask(monkeypatch)
    q, k = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)  # value size 3 != 4
    out = kernels.DropoutAttention.apply(q, k, v, None, 0.2, 0.5)
    ref = (torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1) * masks[0].view(1, 2, 5, 5)) @ v
    torch.testing.assert_close(out, ref)
    (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        g.sum().backward()


def test_a_learnable_bias_keeps_sdpa_and_gets_its_gradient():
    layer = MultiHeadAttention(16, 2, dropout=0.1).train()
    bias = torch.zeros(1, 1, 1, 6, requires_grad=True)
    layer(torch.randn(2, 6, 16), attention_bias=bias)[0].sum().backward()
    assert bias.grad is not None and torch.isfinite(bias.grad).all()
