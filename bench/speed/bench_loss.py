"""The label-smoothed loss alone: ours in one pass against transformers' LabelSmoother and torch's cross_entropy.

    python -m bench loss

Forward and backward of the training loss with label smoothing 0.1 (Section 5.4) on random logits of a batch's shape,
bf16 as bf16 autocast gives them and float32: ours (`LabelSmoothedLoss`, what TranslationTrainer uses), transformers'
`LabelSmoother` (what the stock Seq2SeqTrainer uses) and `torch.nn.functional.cross_entropy(label_smoothing=0.1)`,
interleaved, medians; and the bytes each keeps for the backward pass (autograd's saved-tensor hooks). Shapes: the main
job's batch (1,024 target tokens, 6,000 types) and one process's share of the paper's WMT batch (3,125 target tokens,
37,000 types). Writes bench/results/loss/DATE[_LABEL].json.
"""

import argparse

import torch
from transformers.trainer_pt_utils import LabelSmoother

from bench.helpers.common import (
    add_repetitions,
    add_results_label,
    bytes_saved_for_backward,
    interleaved_medians,
    machine,
    synchronized,
    write_results,
)
from hf_vanilla_transformer.training.loss import LabelSmoothedLoss

SHAPES = {"main job (1,024 x 6,000)": (1024, 6000), "WMT, one process (3,125 x 37,000)": (3125, 37000)}


def torch_cross_entropy(outputs, labels):
    logits = outputs["logits"]
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), label_smoothing=0.1)


LOSSES = {
    "ours": LabelSmoothedLoss(0.1),
    "LabelSmoother": LabelSmoother(0.1),
    "torch cross_entropy": torch_cross_entropy,
}


def measure(tokens: int, vocabulary: int, dtype: torch.dtype, device: torch.device, repetitions: int) -> dict:
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(tokens, vocabulary, generator=generator, device=device).to(dtype).requires_grad_()
    labels = torch.randint(0, vocabulary, (tokens,), generator=generator, device=device)
    labels[-tokens // 10 :] = -100  # padding

    def step(loss_function):
        def run():
            loss_function({"logits": logits}, labels).backward()
            logits.grad = None

        return synchronized(run, device)

    candidates = {name: step(loss) for name, loss in LOSSES.items()}
    for run in candidates.values():  # warm-up
        run()
    medians = interleaved_medians(candidates, repetitions)
    return {
        "milliseconds": {name: round(1000 * seconds, 2) for name, seconds in medians.items()},
        "ratio_label_smoother_to_ours": round(medians["LabelSmoother"] / medians["ours"], 2),
        "saved_for_backward_mib": {
            name: round(bytes_saved_for_backward(lambda loss=loss: loss({"logits": logits}, labels))[1] / 2**20, 1)
            for name, loss in LOSSES.items()
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    add_repetitions(parser, 7)
    add_results_label(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    results = {"machine": machine(), "device": str(device), "repetitions": args.repetitions, "shapes": {}}
    print(f"{'shape':<34} {'logits':<8} {'ours ms':>8} {'LabelSmoother':>14} {'cross_entropy':>14}  saved MiB")
    for shape, (tokens, vocabulary) in SHAPES.items():
        for dtype in (torch.bfloat16, torch.float32):
            measured = measure(tokens, vocabulary, dtype, device, args.repetitions)
            results["shapes"].setdefault(shape, {})[str(dtype).removeprefix("torch.")] = measured
            times, saved = measured["milliseconds"], measured["saved_for_backward_mib"]
            print(
                f"{shape:<34} {str(dtype).removeprefix('torch.'):<8} {times['ours']:>8} "
                f"{times['LabelSmoother']:>14} {times['torch cross_entropy']:>14}  "
                + " / ".join(str(value) for value in saved.values())
            )
    print("wrote", write_results("loss", results, args.results))


if __name__ == "__main__":
    main()
