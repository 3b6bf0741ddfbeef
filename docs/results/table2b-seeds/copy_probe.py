"""Exploratory: where does a masked model's held-out gain come from? Per masked token, whether the
same token id appears unmasked elsewhere in its window (a copy is possible) or not."""

import sys

import torch

from fixedhead.data.lm import heldout_batches, prepare_data
from fixedhead.runs import open_run
from fixedhead.training.evaluate import load_model, recorded_data_settings

torch.set_num_threads(1)
for run_dir in sys.argv[1:]:
    run = open_run(run_dir)
    model = load_model(run).eval()
    data = prepare_data(
        recorded_data_settings(run_dir, run), tokenizer=run.tokenizer, heldout_only=True, progress=False
    )
    ids, labels = heldout_batches(
        data.heldout, run.tokenizer, "mlm", run.settings.get("train", {}).get("eval_seed", 1234)
    )
    sums = {True: [0.0, 0], False: [0.0, 0]}
    with torch.no_grad():
        for i in range(0, ids.shape[0], 256):
            x, y = ids[i : i + 256], labels[i : i + 256]
            loss = torch.nn.functional.cross_entropy(
                model(input_ids=x).logits.float().transpose(1, 2), y, reduction="none"
            )
            same = x[:, None, :] == y[:, :, None]  # [batch, query t, key s]: token s of the input is the target at t
            same &= ~torch.eye(x.shape[1], dtype=torch.bool)  # the masked position itself does not count
            copyable, scored = same.any(-1), y != -100
            for copy in (True, False):
                chosen = scored & (copyable == copy)
                sums[copy][0] += float(loss[chosen].sum())
                sums[copy][1] += int(chosen.sum())
    print(
        run_dir,
        {("copyable" if k else "not copyable"): (round(v[0] / v[1], 4), v[1]) for k, v in sums.items()},
        flush=True,
    )
