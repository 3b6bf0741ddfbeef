"""The models' losses, beside them (as transformers' ``loss/loss_utils.py``): the masked-LM cross-entropy
over the labelled positions, and ``BertForSequenceClassification``'s loss per problem type. The causal LM
uses transformers' ``ForCausalLMLoss``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .configuration import PROBLEM_TYPES
from .tensor_checks import check_finite, check_integer, first_out_of_range, first_outside_interval, tracing


def check_token_labels(labels: torch.Tensor, hidden_states: torch.Tensor, decoder: nn.Linear) -> int:
    """Check LM labels [batch, seq] (-100 = not scored) against the hidden states and the current output
    vocabulary (resizing changes it); returns the vocabulary size. Raises ValueError naming a bad label."""
    vocab = decoder.weight.shape[0]
    check_integer("labels", labels, "an integer tensor of token ids (-100 = not scored)")
    if tuple(labels.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"labels must have shape [batch, seq] = {tuple(hidden_states.shape[:2])}, got {tuple(labels.shape)}"
        )
    bad = first_out_of_range(labels, 0, vocab, ignore=-100)
    if bad is not None:
        raise ValueError(
            f"labels hold {bad[0]}, outside the vocabulary [0, {vocab}) (use -100 to skip a position; "
            f"at index {bad[1]})"
        )
    return vocab


def masked_lm_loss_and_logits(
    head: nn.Module, sequence_output: torch.Tensor, labels: torch.Tensor, vocab: int, num_items_in_batch=None
):
    """Mean cross-entropy over the labelled positions, and logits [batch, seq, vocab].

    ``num_items_in_batch`` (from the Trainer): the labelled positions of the whole global batch, so
    data-parallel and accumulated steps average over every masked token. The output layer runs only at the
    labelled positions (as the original BERT code), scattered into zeros. Nothing labelled: loss 0 with a zero
    gradient (BERT gives NaN). Under ``torch.compile``/``export`` it runs everywhere (same values, full cost).
    """
    batch, seq, hidden = sequence_output.shape
    flat_labels = labels.reshape(-1).long()
    if tracing():
        keep = flat_labels != -100
        logits = head(sequence_output).reshape(batch * seq, vocab).masked_fill(~keep.unsqueeze(1), 0)
        total = F.cross_entropy(logits.float(), flat_labels, ignore_index=-100, reduction="sum")
        count = keep.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return total / count, logits.view(batch, seq, vocab)
    idx = (flat_labels != -100).nonzero().squeeze(1)  # [num_labelled]
    compact = head(sequence_output.reshape(batch * seq, hidden).index_select(0, idx))  # [num_labelled, vocab]
    targets = flat_labels.index_select(0, idx)
    if idx.numel() == 0:
        loss = compact.sum() * 0.0
    elif num_items_in_batch is not None:
        loss = F.cross_entropy(compact.float(), targets, reduction="sum") / num_items_in_batch
    else:
        loss = F.cross_entropy(compact.float(), targets)
    logits = compact.new_zeros(batch * seq, vocab)
    logits.index_copy_(0, idx, compact)
    return loss, logits.view(batch, seq, vocab)


def infer_problem_type(num_labels: int, labels: torch.Tensor) -> str:
    """``BertForSequenceClassification``'s rule when ``config.problem_type`` is unset: one output is
    regression; integer labels (int32/int64) with several outputs are single-label classification;
    anything else (float multi-hot labels) is multi-label classification."""
    if num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def sequence_classification_loss(problem_type: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss ``BertForSequenceClassification`` computes for ``problem_type``, in float32; logits [batch, num_labels].

    ``"regression"``: MSE, labels [batch] or [batch, num_labels]; ``"single_label_classification"``:
    cross-entropy, class ids [batch] (-100 = not scored); ``"multi_label_classification"``: BCE with logits,
    multi-hot labels in [0, 1]. Labels of the wrong shape, dtype or range raise ValueError naming them.
    """
    batch, num_labels = logits.shape
    shape = tuple(labels.shape)
    if problem_type == "regression":
        want = ((batch,), (batch, 1)) if num_labels == 1 else ((batch, num_labels),)
        if shape not in want:
            raise ValueError(f"regression labels must have shape {' or '.join(map(str, want))}, got {shape}")
        if labels.dtype.is_complex or labels.dtype == torch.bool:
            raise ValueError(f"regression labels must be real numbers, got dtype {labels.dtype}")
        check_finite("labels", labels)
        return F.mse_loss(logits.float().reshape(shape), labels.float())
    if problem_type == "single_label_classification":
        check_integer("labels", labels, "class ids (an integer tensor) for single_label_classification")
        if shape not in ((batch,), (batch, 1)):
            raise ValueError(f"single_label_classification labels must have shape ({batch},), got {shape}")
        bad = first_out_of_range(labels, 0, num_labels, ignore=-100)
        if bad is not None:
            raise ValueError(
                f"labels hold class {bad[0]}, outside [0, num_labels={num_labels}) (-100 = not scored; "
                f"at index {bad[1]})"
            )
        return F.cross_entropy(logits.float(), labels.reshape(-1).long())
    if problem_type == "multi_label_classification":
        if shape != (batch, num_labels):
            raise ValueError(
                f"multi_label_classification labels must be multi-hot [batch, num_labels] = {(batch, num_labels)}, "
                f"got {shape}"
            )
        if labels.dtype.is_complex:
            raise ValueError(f"multi_label_classification labels must be real numbers, got dtype {labels.dtype}")
        targets = labels.float()  # int or bool multi-hot labels are accepted too
        check_finite("labels", targets)
        bad = first_outside_interval(targets, 0.0, 1.0)
        if bad is not None:
            raise ValueError(f"multi_label_classification labels must lie in [0, 1], got {bad[0]} (at index {bad[1]})")
        return F.binary_cross_entropy_with_logits(logits.float(), targets)
    raise ValueError(f"problem_type must be one of {PROBLEM_TYPES} or None, got {problem_type!r}")
