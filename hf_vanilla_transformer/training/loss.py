"""Section 5.4's label smoothing, "of value ε_ls = 0.1", as the training loss in one pass over the logits each way.

transformers' `LabelSmoother` computes the loss from the log-softmax over the whole vocabulary at every target
position, negates it into a second tensor of that size, keeps one for the backward pass and builds the gradient there
from several more. For the paper's batches (25,000 targets x 37,000 types) each such tensor is 3.7 GB of float32;
writing and reading them is what a GPU step waits on. Per target position t with logits x, the loss is

    (1 - ε) (-log p_t) + ε mean_v(-log p_v)

and its gradient softmax(x) - (1 - ε) onehot(t) - ε / V. `SmoothedCrossEntropy` computes the first from one
log-softmax that lives only while the forward pass runs, keeps nothing of the logits' size but the logits, and writes
the second in one tensor (an `autograd.Function`: torch's own `cross_entropy(label_smoothing=ε)` keeps its
log-softmax too). `LabelSmoothedLoss` gives it to the Trainer through its public `compute_loss_func` hook.
"""

import torch


class SmoothedCrossEntropy(torch.autograd.Function):
    """The label-smoothed cross-entropy summed over the targets: `logits` (N, V) in any floating dtype, computed in
    float32; `labels` (N,), -100 where there is no target. The backward pass keeps the logits as they came (bf16 under
    autocast) and computes the softmax from them again."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
        # (1 - ε) (-log p_t) + ε mean_v(-log p_v), the log-probabilities in float32 whatever the logits' dtype
        log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # freed on return
        targets = labels.clamp(min=0).unsqueeze(-1)
        per_target = -(1 - epsilon) * log_probs.gather(-1, targets).squeeze(-1) - epsilon * log_probs.mean(dim=-1)
        kept = labels.ne(-100)
        ctx.save_for_backward(logits, targets, kept)
        ctx.epsilon = epsilon
        return torch.where(kept, per_target, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, targets, kept = ctx.saved_tensors
        epsilon = ctx.epsilon
        # (softmax(x) - (1 - ε) onehot(t) - ε / V) * g, for g the gradient of each row's loss (0 where no target)
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        probabilities.scatter_add_(-1, targets, torch.full(targets.shape, epsilon - 1, device=targets.device))
        row_gradient = (grad_output * kept).unsqueeze(-1)
        torch.addcmul(-epsilon / logits.shape[-1] * row_gradient, probabilities, row_gradient, out=probabilities)
        return probabilities.to(logits.dtype), None, None


class LabelSmoothedLoss:
    """The Trainer's `compute_loss_func` for label smoothing `epsilon`: the loss of transformers' `LabelSmoother`
    (the mean over the batch's targets, or over `num_items_in_batch` when the Trainer counts them across gradient
    accumulation and processes), computed by `SmoothedCrossEntropy`."""

    def __init__(self, epsilon: float):
        self.epsilon = epsilon

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None):
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        labels = labels.to(logits.device)
        total = SmoothedCrossEntropy.apply(logits.flatten(0, -2), labels.flatten(), self.epsilon)
        if num_items_in_batch is None:
            num_items_in_batch = labels.ne(-100).sum()
        elif torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
