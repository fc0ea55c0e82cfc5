"""The label-smoothed loss in one pass (training/loss.py): transformers' `LabelSmoother`'s loss and gradient, without
its log-softmax tensors kept for the backward pass; and the Trainer computing it."""

import pytest
import torch
from transformers import DataCollatorForSeq2Seq
from transformers.trainer_pt_utils import LabelSmoother

from hf_vanilla_transformer.training.arguments import TranslationTrainingArguments
from hf_vanilla_transformer.training.loss import LabelSmoothedLoss
from hf_vanilla_transformer.training.trainer import TranslationTrainer
from support.models import letter_tokenizer, reversal_dataset, tiny_model


def logits_and_labels(dtype=torch.float32, batch=3, length=50, vocabulary=1000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, length, vocabulary, generator=generator)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocabulary, (batch, length), generator=generator)
    labels[0, 40:] = -100  # padding: no target there
    labels[2, 10:] = -100
    return logits, labels


def loss_and_gradient(loss_function, logits, labels, **kwargs):
    loss = loss_function({"logits": logits}, labels, **kwargs)
    (gradient,) = torch.autograd.grad(loss, logits)
    return loss.detach(), gradient


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("num_items_in_batch", [None, 200, torch.tensor(77)])
def test_the_loss_and_its_gradient_are_transformers_label_smoothers(epsilon, num_items_in_batch):
    logits, labels = logits_and_labels()
    theirs = loss_and_gradient(LabelSmoother(epsilon), logits, labels, num_items_in_batch=num_items_in_batch)
    ours = loss_and_gradient(LabelSmoothedLoss(epsilon), logits, labels, num_items_in_batch=num_items_in_batch)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-8)
    assert ours[1][labels == -100].abs().max() == 0  # padding takes no share


def test_bf16_logits_are_scored_in_float32_and_get_a_bf16_gradient():
    """Under autocast the logits come in bf16. On a CPU, autocast leaves the log-softmax of bf16 logits in bf16, so
    transformers' `LabelSmoother` rounds every log-probability to 8 bits; ours scores in float32."""
    logits, labels = logits_and_labels(torch.bfloat16)
    ours = loss_and_gradient(LabelSmoothedLoss(0.1), logits, labels)
    exact = loss_and_gradient(LabelSmoother(0.1), logits.detach().float().requires_grad_(), labels)
    assert ours[1].dtype == torch.bfloat16
    torch.testing.assert_close(ours[0], exact[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours[1].float(), exact[1], rtol=1e-2, atol=1e-6)  # bf16's own rounding
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = loss_and_gradient(LabelSmoother(0.1), logits, labels)
    assert abs(float(rounded[0] - exact[0])) > 100 * abs(float(ours[0] - exact[0]))


def bytes_saved_for_backward(loss_function, logits, labels) -> int:
    saved = []

    def pack(tensor):
        saved.append(tensor.untyped_storage().nbytes() if tensor.layout == torch.strided else 0)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_function({"logits": logits}, labels)
    return sum(saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_pass_keeps_the_logits_and_no_tensor_of_the_logits_size_besides(dtype):
    logits, labels = logits_and_labels(dtype, vocabulary=4000)
    ours = bytes_saved_for_backward(LabelSmoothedLoss(0.1), logits, labels)
    theirs = bytes_saved_for_backward(LabelSmoother(0.1), logits, labels)
    logits_bytes = logits.untyped_storage().nbytes()
    per_row = labels.numel() * 8 * 3  # the targets, each row's log-sum-exp, which rows count
    assert logits_bytes <= ours <= logits_bytes + per_row
    assert theirs >= logits.numel() * 4  # the float32 log-probabilities, at least


def translation_trainer(tmp_path, **arguments):
    tokenizer = letter_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))
    args = TranslationTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **arguments)
    dataset = reversal_dataset(tokenizer, 40, seed=0)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    return TranslationTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def test_the_trainer_smooths_labels_with_it_unless_given_a_loss_of_its_own(tmp_path):
    trainer = translation_trainer(tmp_path, label_smoothing_factor=0.1)
    assert isinstance(trainer.compute_loss_func, LabelSmoothedLoss) and trainer.compute_loss_func.epsilon == 0.1
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()  # no dropout: the two losses see the same logits
    logits = trainer.model(**{name: value for name, value in batch.items() if name != "labels"}).logits
    expected = LabelSmoother(0.1)({"logits": logits}, batch["labels"])
    torch.testing.assert_close(trainer.compute_loss(trainer.model, dict(batch)), expected)

    assert translation_trainer(tmp_path, label_smoothing_factor=0.0).compute_loss_func is None  # the model's loss

    def own(outputs, labels, num_items_in_batch=None):
        return outputs["logits"].sum()

    tokenizer = letter_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer))
    args = TranslationTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    assert TranslationTrainer(model=model, args=args, compute_loss_func=own).compute_loss_func is own
