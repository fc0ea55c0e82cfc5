"""run_translation.py on two processes and on two machines (torchrun, accelerate launch), each process's
writes, and the FSDP recipe."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from support.paths import REPO_ROOT, TEST, TRAIN, VALIDATION
from support.processes import audited_ranks, audited_writes, free_port, run_side_by_side, write_audit_env
from support.runs import QUIET_CPU

# Dropout off: each process draws dropout masks from a random stream of its own, which one process accumulating two
# batches cannot reproduce. All else in a step is the same arithmetic, summed in another order.
DISTRIBUTED_RUN = [
    str(REPO_ROOT / "run_translation.py"),
    "--preset",
    "small",
    "--config_overrides",
    "d_model=32,encoder_ffn_dim=64,decoder_ffn_dim=64,encoder_layers=1,decoder_layers=1,dropout=0.0",
    "--train_file",
    TRAIN,
    "--validation_file",
    VALIDATION,
    "--test_file",
    TEST,
    "--max_train_samples",
    "800",
    "--max_eval_samples",
    "24",
    "--max_predict_samples",
    "24",
    "--vocab_size",
    "400",
    "--do_train",
    "--do_eval",
    "--do_predict",
    "--predict_with_generate",
    "--num_beams",
    "2",
    "--per_device_eval_batch_size",
    "8",
    "--max_tokens_per_batch",
    "600",
    "--max_steps",
    "20",
    "--warmup_steps",
    "5",
    "--logging_steps",
    "1",
    "--save_steps",
    "10",
    "--average_last_checkpoints",
    "2",
    *QUIET_CPU,
    "--seed",
    "0",
]
TWO_PROCESSES = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # `--multi_gpu` is what starts several processes: with `--cpu`, accelerate 1.15 starts one (README)
    "accelerate launch": [
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ],
}
# docs/training.md's commands for two machines, one process each: the same command on each machine, with its {node}
# and the first machine's {port} filled in. Here both machines are this one.
TWO_MACHINES = {
    "torchrun": [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:{port}",
        "--rdzv-id",
        "multi30k",
    ],
    "accelerate launch": [
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines",
        "2",
        "--num_processes",
        "2",
        "--machine_rank",
        "{node}",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        "{port}",
    ],
}
ON_TWO_MACHINES = [f"{name} on 2 machines" for name in TWO_MACHINES]


class Launched(NamedTuple):
    """A launch of DISTRIBUTED_RUN: its output folder on the machine of rank 0, the output folders of the other
    machines, and what each process wrote on its machine ({rank: writes}, paths relative to the machine's folder)."""

    output: Path
    other_outputs: list[Path]
    writes: dict[str, list[str]]


@pytest.fixture(scope="module")
def launched_runs(tmp_path_factory) -> dict[str, Launched]:
    """DISTRIBUTED_RUN as one process accumulating 2 batches a step, on 2 processes by each launcher, and on 2
    machines of one process each by each launcher's command for several machines. Each machine is a folder here,
    with the run's output folder, the data cache (HF_DATASETS_CACHE) and the record of every process's writes."""
    accumulating = ["--gradient_accumulation_steps", "2"]
    launches = {
        "one process": ([[]], accumulating),
        **{name: ([launcher], []) for name, launcher in TWO_PROCESSES.items()},
        **{f"{name} on 2 machines": ([launcher] * 2, []) for name, launcher in TWO_MACHINES.items()},
    }
    runs = {}
    for name, (launchers, extra) in launches.items():
        folder, port = tmp_path_factory.mktemp("launch"), free_port()
        machines = [folder / f"machine-{node}" for node in range(len(launchers))]
        commands = [
            [
                sys.executable,
                *(part.format(node=node, port=port) for part in launcher),
                *DISTRIBUTED_RUN,
                *extra,
                "--output_dir",
                str(machines[node] / "run"),
            ]
            for node, launcher in enumerate(launchers)
        ]
        envs = [
            {**write_audit_env(machine / "audit", machine), "HF_DATASETS_CACHE": str(machine / "datasets")}
            for machine in machines
        ]
        logs = [folder / f"{machine.name}.log" for machine in machines]
        statuses = run_side_by_side(commands, envs, logs, timeout=600)
        assert statuses == [0] * len(machines), f"{name}: {statuses}\n" + "\n".join(
            log.read_text()[-3000:] for log in logs
        )
        # rank 0's machine first: torchrun's c10d rendezvous numbers the machines itself (by host name, then by the
        # launcher's process id), whatever their order here; ranks "0" and "1" sort before the launcher's "single"
        machines.sort(key=lambda machine: min(audited_ranks(machine / "audit")))
        writes = {rank: lines for machine in machines for rank, lines in audited_writes(machine / "audit").items()}
        runs[name] = Launched(machines[0] / "run", [machine / "run" for machine in machines[1:]], writes)
    return runs


def logged(output: Path, key: str) -> list[float]:
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    return [entry[key] for entry in history if key in entry]


@pytest.mark.parametrize("launch", [*TWO_PROCESSES, *ON_TWO_MACHINES])
def test_two_processes_learn_what_one_process_accumulating_two_batches_learns(launched_runs, launch):
    """The same batches in the same steps (TokenBudgetBatchSampler deals rank r the batches that accumulation step r
    of one process takes), so the same losses, step for step, and the same averaged model and translations, whether
    the 2 processes are on one machine or on two, each with its own disk. Measured here: bitwise equal (2 processes
    sum 2 gradients in the order one process accumulates them). The tolerance, 1e-6, allows for a backend that sums
    in another order: a few float32 roundings (about 1e-7 of a value) per step, over 20 steps."""
    one = launched_runs["one process"].output
    two = launched_runs[launch].output
    losses = logged(one, "loss")
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.5
    assert logged(two, "loss") == pytest.approx(losses, rel=0, abs=1e-6)
    assert logged(two, "epoch") == pytest.approx(logged(one, "epoch"))  # 2 batches a step, the same epoch fraction
    weights = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert weights[0].keys() == weights[1].keys()
    for key, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][key], tensor, rtol=0, atol=1e-6, msg=key)
    # the test sentences, shared out and gathered back in order, one translation each
    assert (two / "generated_predictions.txt").read_text() == (one / "generated_predictions.txt").read_text()


@pytest.mark.parametrize("launch", [*TWO_PROCESSES, *ON_TWO_MACHINES])
def test_only_the_main_process_writes_the_run(launched_runs, launch):
    """Checkpoints, averaging, evaluation, the card and the predictions are written by rank 0, each once; the data
    cache of each machine (its HF_DATASETS_CACHE) by the machine's first process, which the others wait for."""
    output, other_outputs, writes = launched_runs[launch]
    run_writes = {
        rank: [line for line in lines if not line.split(" ", 1)[1].startswith("datasets")]
        for rank, lines in writes.items()
    }
    assert {rank for rank, lines in run_writes.items() if lines} == {"0"}, run_writes
    for machine in [output.parent, *(other.parent for other in other_outputs)]:  # each its own tokenized data
        assert any((machine / "datasets").rglob("cache-*.arrow")), machine.name
    written = run_writes["0"]
    for path in ("README.md", "attention.png", "generated_predictions.txt", "all_results.json"):
        assert written.count(f"os.rename run/{path}") == 1, path  # write_text_atomically's final rename
    for checkpoint in ("checkpoint-10", "checkpoint-20"):
        assert f"write run/{checkpoint}/trainer_state.json" in written
    assert len((output / "generated_predictions.txt").read_text().splitlines()) == 24
    assert json.loads((output / "all_results.json").read_text())["predict_samples"] == 24


@pytest.mark.parametrize("launch", ON_TWO_MACHINES)
def test_the_other_machine_keeps_only_the_random_state_of_its_process(launched_runs, launch):
    """The other machine's output folder holds what transformers' Trainer writes on every process: the random state
    of its process in each checkpoint, for a resumed run to restore (written by torch, which the write record does not
    see). The main process's rotation deletes checkpoint-10 on its own machine only."""
    run = launched_runs[launch]
    [other] = run.other_outputs
    kept = sorted(path.relative_to(other).as_posix() for path in other.rglob("*") if path.is_file())
    assert kept == ["checkpoint-10/rng_state_1.pth", "checkpoint-20/rng_state_1.pth"]
    assert sorted(path.name for path in (run.output / "checkpoint-20").glob("rng_state*")) == ["rng_state_0.pth"]
    assert not (run.output / "checkpoint-10").exists()


@pytest.mark.slow
def test_processes_that_do_not_join_one_run_are_an_error(tmp_path):
    """`accelerate launch --multi_gpu` without a GPU and without --use_cpu starts 2 processes that each train alone
    (transformers only warns): refused before anything is written."""
    launcher = TWO_PROCESSES["accelerate launch"]
    cpu = DISTRIBUTED_RUN.index("--use_cpu")
    run = DISTRIBUTED_RUN[:cpu] + DISTRIBUTED_RUN[cpu + 2 :]
    result = subprocess.run(
        [sys.executable, *launcher, *run, "--output_dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode != 0
    assert "started as one of 2 processes (WORLD_SIZE=2) that did not join one distributed run" in result.stderr
    assert "give --use_cpu true" in result.stderr and not (tmp_path / "run").exists()


def test_the_fsdp_recipe_is_an_accelerate_config_for_the_layers():
    """recipes/accelerate/fsdp.yaml, read by accelerate's own loader: FSDP2, one unit per layer (accelerate takes the
    layer classes from the model's `_no_split_modules`), full weights gathered for saving."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO_ROOT / "recipes" / "accelerate" / "fsdp.yaml"))
    assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert VanillaTransformerForConditionalGeneration._no_split_modules == [
        "VanillaTransformerEncoderLayer",
        "VanillaTransformerDecoderLayer",
    ]
