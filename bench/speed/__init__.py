"""How fast ours trains and translates, against the peers a user would pick instead.

- bench_tokenizer: training the shared BPE and batch-encoding with it.
- bench_training_step: one training step against MarianMTModel and torch.nn.Transformer, and its MFU.
- bench_loss: the label-smoothed loss alone, ours in one pass against transformers' LabelSmoother and torch's.
- bench_trainer_throughput: the whole Trainer loop, token-budget batches against the stock padded ones.
- bench_bf16: bfloat16 against float32 on a CPU: matrix products, training steps, the loop, translation.
- bench_decoding: generate() against MarianMTModel's, greedy and beam 4, batch 1 and 64.
- bench_ctranslate2: generate() against our CTranslate2 exports and MarianMTModel's.
- bench_onnx: every runtime we export to (ONNX Runtime, CTranslate2, transformers.js) side by side.
- bench_threads: vanilla-translate's --threads on an idle CPU and beside another job.
- bench_profile_models: torch.profiler's share of time per kind of operator, ours and MarianMTModel.
- bench_gpu_check: the GPU path in one short run: bf16 training steps and decoding, bf16 against fp32.
- bench_gpu_session: the GPU points in one prepared run: gpu_check compiled, the loss, 1,000 WMT-shaped steps.
"""
