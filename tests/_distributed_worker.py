"""A plain data-parallel training loop for tests/test_distributed.py, run by ``torch.distributed.run``.

    python -m torch.distributed.run --nproc_per_node 2 tests/_distributed_worker.py \
        --fsdp-config configs/accelerate_fsdp.yaml --mixed-precision no --out DIR

Every process builds the same tiny model (same seed) and the same fixed data: ``STEPS`` global
batches of ``BATCH`` rows × ``SEQ`` token ids (seeded), masked-LM labels from one fixed masking
with exactly ``MASKED_PER_ROW`` masked positions in every row, causal-LM labels = the ids (no
padding, so every row scores ``SEQ - 1`` next tokens). Rank r trains on rows
``[r·BATCH/world, (r+1)·BATCH/world)`` of each global batch, with dropout off, for ``STEPS`` AdamW
steps, under DistributedDataParallel (``ddp``), under FSDP2 (``fsdp2``: ``fully_shard`` on every
module of the classes the accelerate config names, then on the root, with its
``reshard_after_forward``), or, launched by ``accelerate launch --config_file ...``, under FSDP2 as
accelerate itself applies it (``accelerate-fsdp2``).

Loss normalisation: each rank's loss is the model's mean over its scored tokens; DDP and FSDP2
average gradients over ranks, and the logged loss is the mean of the ranks' losses. That equals the
mean over the global batch because every rank scores the same number of tokens, by construction of
the data; ``train`` checks this (all ranks' counts are gathered and compared) rather than assuming it.

``train(objective, "none", rank=0, world=1)`` is the single-process reference: the same loop on the
whole global batch. On rank 0 the distributed runs write ``{objective}-{wrapper}.json`` (per-step
losses and what was wrapped) and ``{objective}-{wrapper}.safetensors`` (the final full parameters).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM

VOCAB, SEQ, BATCH, STEPS = 100, 16, 8, 4
MASK_ID, FIRST_ORDINARY_ID = 3, 5  # ids below 5 play the special tokens (0 = padding)
MASKED_PER_ROW = 3
LEARNING_RATE, WEIGHT_DECAY = 3e-3, 0.01
OBJECTIVES = ("mlm", "clm")
WRAPPERS = ("ddp", "fsdp2")


def model_config() -> FixedHeadConfig:
    return FixedHeadConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )


def fixed_batches(objective: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels), each [STEPS, BATCH, SEQ], the same in every process (seeded generator)."""
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(FIRST_ORDINARY_ID, VOCAB, (STEPS, BATCH, SEQ), generator=g)
    if objective == "clm":
        return ids, ids.clone()  # the model shifts the labels inside
    where = torch.rand(STEPS, BATCH, SEQ, generator=g).argsort(-1)[..., :MASKED_PER_ROW]  # the same count per row
    labels = torch.full_like(ids, -100).scatter(-1, where, ids.gather(-1, where))
    return ids.scatter(-1, where, MASK_ID), labels


def scored_tokens(objective: str, labels: torch.Tensor) -> int:
    """How many tokens the model's mean loss averages over for these [rows, SEQ] labels."""
    scored = labels[:, 1:] if objective == "clm" else labels
    return int((scored != -100).sum())


def read_fsdp_config(path: str | os.PathLike) -> dict:
    """The FSDP settings of an accelerate config file, refusing what this loop does not reproduce."""
    import yaml

    cfg = yaml.safe_load(Path(path).read_text())
    fsdp = cfg.get("fsdp_config", {})
    if cfg.get("distributed_type") != "FSDP" or int(fsdp.get("fsdp_version", 1)) != 2:
        raise ValueError(f"{path}: expected distributed_type FSDP with fsdp_version 2")
    if fsdp.get("fsdp_auto_wrap_policy") != "TRANSFORMER_BASED_WRAP":
        raise ValueError(f"{path}: expected fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP")
    for key in ("fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading"):
        if fsdp.get(key):
            raise ValueError(f"{path}: {key}: true is not reproduced by this test loop")
    return {
        "layer_classes": [c.strip() for c in str(fsdp["fsdp_transformer_layer_cls_to_wrap"]).split(",")],
        "reshard_after_forward": bool(fsdp.get("fsdp_reshard_after_forward", True)),
        "mixed_precision": cfg.get("mixed_precision", "no"),
    }


def shard(model: torch.nn.Module, fsdp: dict, world: int) -> None:
    """FSDP2 as the config says: ``fully_shard`` each module of the named classes, then the root.

    The root unit keeps everything else, in particular the word embeddings and the LM decoder,
    whose tied weight is one parameter and must stay in one unit.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    blocks = [m for m in model.modules() if type(m).__name__ in fsdp["layer_classes"]]
    if not blocks:
        raise ValueError(f"no module of the classes {fsdp['layer_classes']} in {type(model).__name__}")
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=fsdp["reshard_after_forward"])
    fully_shard(model, mesh=mesh, reshard_after_forward=fsdp["reshard_after_forward"])


def shard_as_accelerate(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 exactly as ``accelerate`` applies it: its plugin, read from the environment that
    ``accelerate launch --config_file ...`` sets, and its ``fsdp2_prepare_model``.

    accelerate enables FSDP only on accelerators (on CPU its ``Accelerator`` falls back to plain
    data parallelism), so the accelerator argument is a stand-in holding what that function reads.
    """
    import types

    from accelerate.utils import FullyShardedDataParallelPlugin, fsdp2_prepare_model

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        raise RuntimeError("accelerate-fsdp2 needs `accelerate launch --config_file <an FSDP config>`")
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != "no":
        raise ValueError("this loop compares float32 runs: launch with --mixed_precision no")
    plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables accelerate launch set
    if plugin.fsdp_version != 2:
        raise ValueError(f"expected FSDP version 2, the config gives {plugin.fsdp_version}")
    stand_in = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=None,
        parallelism_config=None,
        mixed_precision="no",
        device=torch.device("cpu"),
        is_main_process=dist.get_rank() == 0,
    )
    return fsdp2_prepare_model(stand_in, model)


def fsdp_units(model: torch.nn.Module) -> list[str]:
    """Names of the modules that are FSDP2 units ("" = the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every (deduplicated) parameter, gathered whole when sharded; names without wrapper prefixes."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p  # a DTensor under FSDP2
        out[name] = t.detach().clone().contiguous()
    return out


def train(objective: str, wrapper: str, rank: int = 0, world: int = 1, fsdp: dict | None = None):
    """STEPS AdamW steps on this rank's share of each global batch. Returns (losses, params, info):
    the per-step losses over the global batch, the final full parameters, and what was wrapped.

    Without a process group, ``world > 1`` trains on rank ``rank``'s share alone (no averaging):
    the control that shows the comparison would notice a run that did not combine the ranks."""
    torch.manual_seed(0)
    cls = FixedHeadForMaskedLM if objective == "mlm" else FixedHeadForCausalLM
    model = cls(model_config()).train()
    base = model
    inputs, labels = fixed_batches(objective)
    if BATCH % world:
        raise ValueError(f"global batch {BATCH} does not split over {world} processes")
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    info = {"world_size": world, "wrapper": wrapper, "rows_per_rank": BATCH // world}
    together = world > 1 and dist.is_initialized()  # False: this rank's share alone (a control)
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    elif wrapper == "fsdp2":
        shard(model, fsdp, world)
        info["fsdp_units"] = fsdp_units(model)
        info["reshard_after_forward"] = fsdp["reshard_after_forward"]
    elif wrapper == "accelerate-fsdp2":
        model = shard_as_accelerate(model)
        info["fsdp_units"] = fsdp_units(model)
    elif wrapper != "none":
        raise ValueError(f"unknown wrapper {wrapper!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        count = torch.tensor([scored_tokens(objective, labels[step, rows])])
        if together:
            counts = [torch.zeros_like(count) for _ in range(world)]
            dist.all_gather(counts, count)
            if len({int(c) for c in counts}) != 1:
                raise AssertionError(f"step {step}: ranks score different numbers of tokens {counts}")
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=inputs[step, rows], labels=labels[step, rows]).loss
        loss.backward()
        opt.step()
        loss = loss.detach().clone()
        if together:
            dist.all_reduce(loss)  # sum of the ranks' means
            loss /= world
        losses.append(loss.item())
    params = full_parameters(base)
    info["tied"] = base.cls.decoder.weight is base.fixedhead.embeddings.word_embeddings.weight
    if together:  # every rank ends with the same (full) parameters
        worst = torch.zeros(())
        for t in params.values():
            ref = t.clone()
            dist.broadcast(ref, src=0)
            worst = torch.maximum(worst, (t - ref).abs().max())
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        info["max_diff_between_ranks"] = worst.item()
    return losses, params, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--wrappers", default=",".join(WRAPPERS), help="of ddp, fsdp2, accelerate-fsdp2")
    parser.add_argument("--fsdp-config", help="for fsdp2: an accelerate config file with FSDP2 settings")
    parser.add_argument(
        "--mixed-precision",
        default=None,
        help="override the config's mixed_precision, as `accelerate launch --mixed_precision`",
    )
    args = parser.parse_args()
    wrappers = args.wrappers.split(",")
    fsdp = None
    if "fsdp2" in wrappers:
        fsdp = read_fsdp_config(args.fsdp_config)
        if args.mixed_precision is not None:
            fsdp["mixed_precision"] = args.mixed_precision
        if fsdp["mixed_precision"] != "no":
            raise ValueError("this loop compares float32 runs: pass --mixed-precision no")
    # FSDP2 warns that the models' outputs hold a view (the logits); harmless: nothing here
    # modifies an output in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    try:
        for objective in args.objectives.split(","):
            for wrapper in wrappers:
                losses, params, info = train(objective, wrapper, rank, world, fsdp)
                if rank == 0:
                    from safetensors.torch import save_file

                    save_file(params, str(out / f"{objective}-{wrapper}.safetensors"))
                    (out / f"{objective}-{wrapper}.json").write_text(json.dumps({"losses": losses, **info}))
                del params
                # an FSDP2 model sits in reference cycles; left to the collector at interpreter exit,
                # after the process group is gone, it sometimes aborted the process ("terminate called
                # without an active exception", ~1 run in 6 under accelerate launch): free it now
                gc.collect()
                dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
