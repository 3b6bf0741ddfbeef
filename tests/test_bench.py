"""The benchmark measures what it says (no timings asserted here, ever)."""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_training_step.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_training_step", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_training_rows_train_in_train_mode_after_the_inference_rows():
    # the inference rows share the models and put them in eval mode; a training row must still
    # train with dropout (it once timed eval-mode steps: no dropout, a faster and wrong number)
    bench = load_bench()
    args = argparse.Namespace(
        batch=2,
        seq=8,
        vocab=200,
        hidden=16,
        layers=1,
        heads=2,
        fixed_heads=2,
        fixed_head_dim=8,
        masked=0.25,
        bf16=False,
        adamw="foreach",
        levers=True,
        compile=False,
    )
    torch.manual_seed(0)
    rows, models = bench.build_rows(args, torch.device("cpu"))
    for row in rows:  # the benchmark's warm-up order: train rows, then inference rows
        row.step()
    seen = {}
    for name, model in models.items():
        model.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, m.training))
    for row in rows:
        if row.mode == "train" and row.group == "main":
            row.step()
    assert seen == {name: True for name in models}
    for row in rows:
        if row.mode == "infer":
            row.step()
    assert not any(m.training for m in models.values())


def test_dropout_0_rows_have_no_dropout_and_the_others_keep_it():
    from fixedhead import FixedHeadConfig, FixedHeadForMaskedLM

    bench = load_bench()
    cfg = FixedHeadConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=8,
    )  # dropout 0.1 (BERT's)
    model = FixedHeadForMaskedLM(cfg).train()
    plain = bench.without_dropout(model).train()
    ids = torch.randint(5, 50, (2, 8))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, plain(input_ids=ids).logits)
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
        model.eval()
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits)  # same weights


def test_lever_variants_compute_the_same_function():
    """The unfused-q,k,v and zero-bias rows time the same model, only computed the other way."""
    from fixedhead import FixedHeadConfig, FixedHeadForMaskedLM
    from fixedhead.model.attention import MultiHeadAttention

    bench = load_bench()
    cfg = FixedHeadConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=12,
        intermediate_size=32,
        max_position_embeddings=8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = FixedHeadForMaskedLM(cfg).eval()
    ids, mask = torch.randint(5, 50, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    labels = torch.where(torch.rand(2, 8) < 0.5, ids, -100)
    ref = model(input_ids=ids, attention_mask=mask, labels=labels)
    ref.loss.backward()
    unfused, biased = bench.with_unfused_qkv(model).eval(), bench.with_zero_bias(model).eval()
    seen = []
    for m in biased.modules():
        if isinstance(m, MultiHeadAttention):
            m.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["attention_bias"]), with_kwargs=True)
    for variant in (unfused, biased):
        out = variant(input_ids=ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out.logits, ref.logits, atol=1e-6, rtol=1e-5)
        out.loss.backward()
    # an all-ones mask: the model itself passes no bias; the variant gets a zero one in every layer
    assert len(seen) == 2 and all(b is not None and b.shape == (2, 1, 1, 8) and not b.any() for b in seen)
    # three projections with their own weights, whose gradients are the fused weight's slices
    fused = model.fixedhead.encoder["layer"][0].attention.qkv
    split = unfused.fixedhead.encoder["layer"][0].attention.qkv
    assert isinstance(split, bench.UnfusedQKV)
    grads = torch.cat([p.weight.grad for p in (split.query, split.key, split.value)])
    torch.testing.assert_close(grads, fused.weight.grad, atol=1e-6, rtol=1e-5)


def test_startup_benchmark_refuses_a_command_that_did_not_do_what_its_row_says():
    """bench_startup times a command only if it exits as its row says (--help 0, a bad option 2)."""
    import pytest

    spec = importlib.util.spec_from_file_location("bench_startup", BENCH.with_name("bench_startup.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.seconds([sys.executable, "-c", "raise SystemExit(2)"], 2, repeats=1) > 0
    with pytest.raises(RuntimeError, match="exited 2, not 0"):
        bench.seconds([sys.executable, "-c", "raise SystemExit(2)"], 0, repeats=1)
    assert [status for _, _, status in bench.ROWS][:2] == [0, 2]
